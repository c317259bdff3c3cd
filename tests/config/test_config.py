"""Recipe loading: defaults inheritance, overrides, schema validation and error messages."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rise_nemo.config import ConfigError, config_from_dict, load_config, to_yaml
from rise_nemo.methods.registry import METHODS

REPO = Path(__file__).resolve().parents[2]


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


def test_defaults_chain_is_relative_and_ordered(tmp_path):
    write(tmp_path / "common" / "base.yaml", {"run": {"name": "base", "seed": 1}, "sampling": {"group_size": 4}})
    write(tmp_path / "common" / "more.yaml", {"defaults": "base.yaml", "sampling": {"max_new_tokens": 9}})
    child = write(tmp_path / "recipes" / "child.yaml",
                  {"defaults": ["../common/more.yaml"], "run": {"name": "child"}, "method": "rubric_rl"})
    cfg = load_config(child)
    assert cfg.run.name == "child" and cfg.run.seed == 1  # child overrides, base fills in
    assert cfg.sampling.group_size == 4 and cfg.sampling.max_new_tokens == 9
    assert cfg.method == "rubric_rl"
    assert cfg.policy_loss.clip_high == pytest.approx(0.28)  # schema default filled in


def test_overrides_set_add_delete_and_parse_values(tmp_path):
    recipe = write(tmp_path / "r.yaml", {"nemo": {"policy": {"tp": 1}}})
    cfg = load_config(recipe, ["sampling.group_size=16", "++nemo.policy.lr=1e-6", "++nemo.policy.fp8=true",
                               "+nemo.cluster.nodes=2", "~nemo.policy.tp", "rise.top_m=null"])
    assert cfg.sampling.group_size == 16
    assert cfg.nemo.policy.lr == pytest.approx(1e-6)  # "1e-6" is a number, not YAML 1.1's string
    assert cfg.nemo.policy.fp8 is True and "tp" not in cfg.nemo.policy
    assert cfg.nemo.cluster.nodes == 2
    assert cfg.rise.top_m is None


def test_overrides_accept_forms_hydras_grammar_rejects(tmp_path, monkeypatch):
    """docs/DESIGN.md §3 "Command-line overrides": why the loader keeps its own grammar. Hydra-core's parser
    (NeMo-RL's) rejects an unquoted nested interpolation and a ~/ path; both are in use and work here."""
    monkeypatch.setenv("RISE_TEST_JUDGE_URLS", '["http://127.0.0.1:9/v1"]')
    recipe = write(tmp_path / "r.yaml", {})
    cfg = load_config(recipe, ["++judge.base_urls=${oc.decode:${oc.env:RISE_TEST_JUDGE_URLS}}",
                               "data.train_path=~/data/train.jsonl", "++nemo.note=a b c"])
    assert list(cfg.judge.base_urls) == ["http://127.0.0.1:9/v1"]
    assert cfg.data.train_path == "~/data/train.jsonl" and cfg.nemo.note == "a b c"


def test_override_of_unknown_key_is_rejected_with_hint(tmp_path):
    recipe = write(tmp_path / "r.yaml", {})
    with pytest.raises(ConfigError, match=r"unknown key 'sampling\.grop_size'.*\+\+sampling\.grop_size"):
        load_config(recipe, ["sampling.grop_size=3"])


@pytest.mark.parametrize("bad", ["sampling.group_size", "=3", "grpo..x=1", "+sampling.group_size=2", "~sampling.nothing",
                                 "++nemo.x={a:1}", "++nemo.x=[{a: {b:2}}]"])
def test_bad_override_syntax_names_the_override(tmp_path, bad):
    recipe = write(tmp_path / "r.yaml", {"sampling": {"group_size": 4}})
    with pytest.raises(ConfigError, match="command-line override"):
        load_config(recipe, [bad])


def test_unknown_key_in_file_names_key_and_file(tmp_path):
    base = write(tmp_path / "base.yaml", {"sampling": {"group_sise": 8}})
    child = write(tmp_path / "child.yaml", {"defaults": "base.yaml", "run": {"name": "x"}})
    with pytest.raises(ConfigError) as info:
        load_config(child)
    msg = str(info.value)
    assert "sampling.group_sise" in msg and str(base) in msg  # the file that actually holds the typo
    assert "group_size" in msg  # lists the allowed keys


def test_unknown_top_level_block(tmp_path):
    recipe = write(tmp_path / "r.yaml", {"trian": {"steps": 3}})
    with pytest.raises(ConfigError, match=r"unknown key 'trian'"):
        load_config(recipe)


@pytest.mark.parametrize(
    ("tree", "pattern"),
    [
        ({"sampling": {"group_size": "eight"}}, r"'sampling\.group_size': expected an integer"),
        ({"sampling": {"group_size": 1}}, r"'sampling\.group_size': must be >= 2"),
        ({"method": "dpo"}, r"'method': must be one of"),
        ({"train": {"progress": "yes"}}, r"'train\.progress': expected true/false"),
        ({"rise": {"schedule": {"mode": "sometimes"}}}, r"'rise\.schedule\.mode'"),
        ({"sampling": 3}, r"'sampling' must be a mapping"),
    ],
)
def test_type_and_range_errors_name_key_and_file(tmp_path, tree, pattern):
    recipe = write(tmp_path / "r.yaml", tree)
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(recipe)
    assert str(recipe) in str(info.value)


def test_bad_yaml_names_file_and_line(tmp_path):
    recipe = write(tmp_path / "r.yaml", "run:\n  name: x\ngrpo: [unclosed\n")
    with pytest.raises(ConfigError, match=r"r\.yaml:\d+: invalid YAML"):
        load_config(recipe)


def test_missing_and_circular_defaults(tmp_path):
    missing = write(tmp_path / "m.yaml", {"defaults": "nope.yaml"})
    with pytest.raises(ConfigError, match=r"m\.yaml: key 'defaults' names 'nope\.yaml'"):
        load_config(missing)
    write(tmp_path / "a.yaml", {"defaults": "b.yaml"})
    write(tmp_path / "b.yaml", {"defaults": "a.yaml"})
    with pytest.raises(ConfigError, match="circular defaults"):
        load_config(tmp_path / "a.yaml")
    with pytest.raises(ConfigError, match="recipe file not found"):
        load_config(tmp_path / "absent.yaml")
    write(tmp_path / "list.yaml", "- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a YAML mapping"):
        load_config(tmp_path / "list.yaml")


def test_interpolation_and_secret_redaction(tmp_path):
    recipe = write(tmp_path / "r.yaml", {"run": {"name": "abc", "dir": "/tmp/runs/${run.name}"},
                                         "judge": {"type": "http", "api_key": "sk-123", "model": "m"}})
    cfg = load_config(recipe)
    assert cfg.run.dir == "/tmp/runs/abc"
    text = to_yaml(cfg)
    assert "sk-123" not in text and "redacted" in text
    assert "max_new_tokens" in text and "model: m" in text  # non-secret keys kept


def test_config_is_read_only():
    cfg = config_from_dict({"run": {"name": "x"}})
    with pytest.raises(Exception):  # noqa: B017 - omegaconf raises ReadonlyConfigError
        cfg.run.name = "y"


def test_every_shipped_recipe_validates():
    recipes = sorted((REPO / "recipes").glob("*.yaml"))
    assert recipes, "no recipes shipped"
    for path in recipes:  # the nemo block itself is validated by rise_nemo.backends.nemo, not here
        if "stages" in (yaml.safe_load(path.read_text()) or {}):  # a pipeline: every stage's recipe validates
            from rise_nemo.loop.pipeline import load_pipeline, stage_config

            pipeline = load_pipeline(path)
            assert all(stage_config(pipeline, s).method in METHODS for s in pipeline.stages), path
            continue
        cfg = load_config(path)
        assert cfg.method in METHODS, path


# -- keys of earlier releases (schema.RENAMED_KEYS) ----------------------------------------------------------

def test_every_renamed_key_points_at_a_schema_key():
    from rise_nemo.config.loader import _schema_has
    from rise_nemo.config.schema import RENAMED_KEYS

    assert RENAMED_KEYS["grpo.group_size"] == "sampling.group_size" and RENAMED_KEYS["grpo.eps"] == "advantage.eps"
    assert RENAMED_KEYS["grpo.kl_coef"] == "policy_loss.kl_coef"
    assert all(_schema_has(new) and not _schema_has(old) for old, new in RENAMED_KEYS.items())


@pytest.mark.parametrize(("old", "new"), [("group_size", "sampling.group_size"), ("kl_coef", "policy_loss.kl_coef"),
                                          ("eps", "advantage.eps")])
def test_an_old_key_in_a_recipe_file_names_the_file_and_the_new_key(tmp_path, old, new):
    recipe = write(tmp_path / "r.yaml", {"run": {"name": "x"}, "grpo": {old: 4}})
    with pytest.raises(ConfigError) as info:
        load_config(recipe)
    assert str(info.value) == f"{recipe}: key 'grpo.{old}' was renamed to '{new}'"


def test_an_old_key_in_an_inherited_file_names_that_file(tmp_path):
    base = write(tmp_path / "common" / "base.yaml", {"grpo": {"temperature": 0.8}})
    child = write(tmp_path / "child.yaml", {"defaults": "common/base.yaml", "sampling": {"group_size": 4}})
    with pytest.raises(ConfigError) as info:
        load_config(child)
    assert str(info.value) == f"{base}: key 'grpo.temperature' was renamed to 'sampling.temperature'"
    with pytest.raises(ConfigError, match=r"^<dict>: key 'grpo\.top_p' was renamed to 'sampling\.top_p'$"):
        config_from_dict({"grpo": {"top_p": 0.9}})


@pytest.mark.parametrize(("override", "message"), [
    ("grpo.group_size=4", "key 'grpo.group_size' was renamed to 'sampling.group_size'"),
    ("++grpo.clip_high=0.3", "key 'grpo.clip_high' was renamed to 'policy_loss.clip_high'"),
    ("~grpo.eps", "key 'grpo.eps' was renamed to 'advantage.eps'"),
    ("grpo.grop_size=4", "key 'grpo.grop_size': block 'grpo' was split into 'sampling', 'policy_loss' and 'advantage'"),
])
def test_an_old_key_in_an_override_names_the_new_key(tmp_path, override, message):
    recipe = write(tmp_path / "r.yaml", {"run": {"name": "x"}})
    with pytest.raises(ConfigError) as info:
        load_config(recipe, [override])
    assert str(info.value) == f"command-line override {override!r}: {message}"


def test_nemo_rl_s_own_grpo_block_is_not_an_old_key(tmp_path):
    recipe = write(tmp_path / "r.yaml", {"nemo": {"grpo": {"num_prompts_per_step": 4}}})
    cfg = load_config(recipe, ["nemo.grpo.num_prompts_per_step=8"])
    assert cfg.nemo.grpo.num_prompts_per_step == 8
