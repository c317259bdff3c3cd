"""One-pass guidance (rise.guidance_pass=one, core.guidance rule 6) through the real loop on the local backend:
hints come from the prompt's previous visit, first visits fall back to the paper's two passes, a revisited
step makes ONE generate call, and a resumed run equals the uninterrupted one."""

from __future__ import annotations

import pytest
import tiny_task
import torch
from test_orch_loop import _hinted
from test_orch_resume import _evals, _reproducible

from rise_nemo.config import ConfigError, config_from_dict
from rise_nemo.core.prompts import format_hint
from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.trainer import read_metrics
from rise_nemo.steps.rubric import feedback_indices, guidance_options

# 6 prompts, 2 per step: steps 1-3 visit every prompt once (epoch 0), steps 4-6 revisit them (epoch 1).
ONE = ["rise.guidance_pass=one", "train.steps=6", "rise.schedule.switch_step=7", "eval.every=0",
       "eval.at_start=false"]


class EventLog:
    """Wraps the real generator, judge and policy; records every call in order."""

    def __init__(self):
        self.events: list[tuple] = []

    def wrap(self, policy, generator, judge):
        log = self

        class Gen:
            def __getattr__(self, name):
                return getattr(generator, name)

            def generate(self, prompts, n, params, prefixes=None):
                log.events.append(("generate", [list(p) for p in prompts], n))
                return generator.generate(prompts, n, params)

        class Judge:
            def __getattr__(self, name):
                return getattr(judge, name)

            def judge(self, requests):
                out = judge.judge(requests)
                log.events.append(("judge", list(requests), [list(v) for v in out]))
                return out

        class Policy:
            def __getattr__(self, name):
                return getattr(policy, name)

            def train(self, data, loss_fn):
                log.events.append(("train",))
                return policy.train(data, loss_fn)

        return Policy(), Gen(), Judge()

    def steps(self) -> list[list[tuple]]:
        out, cur = [], []
        for e in self.events:
            cur.append(e)
            if e[0] == "train":
                out.append(cur)
                cur = []
        return out


def _run(make_trainer, run_dir, over):
    log = EventLog()
    assert make_trainer(run_dir, "rise", over, wrap=log.wrap).run() == 0
    return log, read_metrics(run_dir)


@pytest.mark.parametrize("g_priv", [4, 2])  # G' = G: one generate(n=G); G' != G: one flat generate(n=1)
def test_revisited_steps_make_one_generate_call_with_the_previous_visits_hints(tmp_path, make_trainer, g_priv):
    log, metrics = _run(make_trainer, tmp_path, [*ONE, f"rise.privileged_group_size={g_priv}"])
    steps = log.steps()
    assert len(steps) == 6
    prompts = {p.prompt_id: p for p in tiny_task.make_prompts(6)}
    by_text = {p.messages[0]["content"]: p for p in prompts.values()}
    expected_hint: dict[str, str | None] = {}  # prompt id -> the hint its previous visit's natural group implies
    for s, events in enumerate(steps, start=1):
        gens = [e for e in events if e[0] == "generate"]
        natural_judged = next(e for e in events if e[0] == "judge")
        m = metrics[s - 1]
        if s <= 3:  # first visits: the paper's two passes (natural call, then a privileged call if any hint)
            assert m["guidance/one_pass_prompts"] == 0
            assert len(gens) == 1 + (m["guidance/two_pass_prompts"] > 0)
            assert not any(_hinted(c) for c in gens[0][1])
        else:  # every prompt was seen: ONE call holding natural and privileged prompts
            assert len(gens) == 1 and m["guidance/two_pass_prompts"] == 0
            convs, n = gens[0][1], gens[0][2]
            natural = [c for c in convs if not _hinted(c)]
            hinted = [c for c in convs if _hinted(c)]
            want = {pid: h for pid, h in expected_hint.items() if h is not None}
            step_ids = {by_text[c[-1]["content"]].prompt_id for c in natural}
            want = {pid: h for pid, h in want.items() if pid in step_ids}
            assert m["guidance/one_pass_prompts"] == len(want) and m["guidance/guided_prompts"] == len(want)
            if g_priv == 4:
                assert n == 4 and len(natural) == 2 and len(hinted) == len(want)
            else:  # flattened: G rows per natural prompt, G' per hinted one
                assert n == 1 and len(natural) == 2 * 4 and len(hinted) == 2 * len(want)
            for c in hinted:  # the hint names exactly the previous visit's feedback criteria (eqs. 4-5)
                pid = next(p for p, h in want.items() if c[-1]["content"].startswith(prompts[p].messages[0]["content"]))
                assert want[pid] in c[-1]["content"]
            assert m["guidance/privileged_rollouts"] == g_priv * len(want)
        # This visit's natural verdicts -> the next visit's hint (computed here from the recorded judge call).
        requests, verdicts = natural_judged[1], natural_judged[2]
        for pid in dict.fromkeys(r.prompt_id for r in requests):
            rows = [v for r, v in zip(requests, verdicts) if r.prompt_id == pid]
            ks = feedback_indices(prompts[pid], rows, torch.ones(len(rows), dtype=torch.bool), 5)
            expected_hint[pid] = format_hint([prompts[pid].rubric.criteria[k] for k in ks]) if ks else None
    assert sum(m["guidance/one_pass_prompts"] for m in metrics[3:]) > 0, "no revisit was hinted: nothing tested"
    assert sum(m["guidance/retained"] for m in metrics[3:]) > 0, "no one-pass response was retained"


def test_two_pass_default_is_unchanged_and_paper_faithful_turns_one_pass_off(tmp_path, make_trainer,
                                                                              tiny_tokenizer):
    log, metrics = _run(make_trainer, tmp_path / "two", ["train.steps=4", "rise.schedule.switch_step=7",
                                                         "eval.every=0", "eval.at_start=false"])
    for events, m in zip(log.steps(), metrics):
        assert [e[0] for e in events].count("generate") == 1 + (m["guidance/guided_prompts"] > 0)
        assert "guidance/one_pass_prompts" not in m
    base = tiny_task.recipe(tiny_tokenizer, tmp_path)
    assert guidance_options(config_from_dict(base, ["rise.guidance_pass=one"])).one_pass
    assert not guidance_options(config_from_dict(base, ["rise.guidance_pass=one", "rise.paper_faithful=true"])).one_pass
    assert not guidance_options(config_from_dict(base, [])).one_pass  # the default is the paper's two passes


def test_one_pass_with_a_privileged_budget_is_a_one_line_error(tmp_path, make_trainer):
    with pytest.raises(ConfigError, match=r"rise\.guidance_pass.*rise\.gate\.budget"):
        make_trainer(tmp_path, "rise", [*ONE, "rise.gate.budget=0.5"])


def test_resume_inside_the_one_pass_phase_is_exact(tmp_path, make_trainer):
    over = [*ONE, "eval.every=3"]
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert make_trainer(full, "rise", over).run() == 0
    first = make_trainer(parts, "rise", over, stop_after=4)  # after the first revisit: the state is non-empty
    assert first.run() == 0 and ckpt.latest_checkpoint(parts).name == "step_000004"
    state = torch.load(ckpt.latest_checkpoint(parts) / "trainer.pt", weights_only=False)
    assert len(state["previous_failures"]["hints"]) == 6
    assert make_trainer(parts, "rise", over).run() == 0
    a, b = read_metrics(full), read_metrics(parts)
    assert [m["step"] for m in b] == [1, 2, 3, 4, 5, 6]
    assert _reproducible(a) == _reproducible(b)
    assert _evals(full) == _evals(parts)
    assert sum(m["guidance/one_pass_prompts"] for m in a[4:]) > 0  # the resumed steps used the restored hints


def test_one_pass_resumes_exactly_through_the_cli(tmp_path, tiny_tokenizer):
    """The recipe key through the real CLI path (YAML, validation, build_trainer, checkpoint, --stop-after,
    resume), as tests/test_method_registry.py runs a method."""
    from rise_nemo.cli import main

    blocks = {"rise": {"lambda_guide": 0.2, "guidance_pass": "one", "schedule": {"mode": "fixed", "switch_step": 7}},
              "train": {"steps": 5, "checkpoint_every": 2, "progress": False, "keep_checkpoints": 0},
              "eval": {"every": 0, "at_start": False, "samples_per_prompt": 8}}
    full = tiny_task.write_recipe(tmp_path / "a", tiny_tokenizer, tmp_path / "full", **blocks)
    parts = tiny_task.write_recipe(tmp_path / "b", tiny_tokenizer, tmp_path / "parts", **blocks)
    assert main(["train", "--config", str(full)]) == 0
    assert main(["train", "--config", str(parts), "--stop-after", "4"]) == 0
    assert [m["step"] for m in read_metrics(tmp_path / "parts")] == [1, 2, 3, 4]
    assert main(["train", "--config", str(parts)]) == 0
    a, b = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "parts")
    assert _reproducible(a) == _reproducible(b)
    assert a[4]["guidance/one_pass_prompts"] > 0  # step 5, after the resume, was hinted from restored state
