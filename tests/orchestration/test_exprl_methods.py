"""ExpRL's methods in the reasoning step (rise_nemo.steps.exprl) on the embedded task: scoring
hooks with unknown and truncated rollouts, per-token process advantages in the batch, the policy never
sampling with the reference, the baselines (sft, self_distillation), and runs through build_trainer."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tiny_task import chain_recipe

from rise_nemo.config import config_from_dict
from rise_nemo.core.exprl import token_process_advantages
from rise_nemo.interfaces import Rollout
from rise_nemo.judges.reference import RuleReferenceJudge
from rise_nemo.loop.run import build_trainer
from rise_nemo.loop.trainer import read_metrics
from rise_nemo.methods.registry import get_method
from rise_nemo.steps import exprl
from rise_nemo.steps.reasoning import ReasoningContext, reasoning_train_step
from rise_nemo.steps.rollouts import find_tokenizer


def _cfg(run_dir: Path, method: str, steps: int = 2, **extra):
    return config_from_dict(chain_recipe(method, run_dir, group_size=3, max_new_tokens=20, steps=steps,
                                         exprl={"segment_marker": "step", "teacher_intro": "", **extra}))


class SpyGenerator:
    """The backend's generator, recording every prompt the policy samples under."""

    def __init__(self, inner):
        self.inner, self.prompts = inner, []
        self.engine = inner.engine

    def generate(self, prompts, n, params, prefixes=None):
        self.prompts.extend(prompts)
        return self.inner.generate(prompts, n, params, prefixes=prefixes)

    def __getattr__(self, name):
        return getattr(self.inner, name)


class ScriptedJudge(RuleReferenceJudge):
    """The rule judge, but rollouts named in ``unknown`` get no score (a reply that never parsed)."""

    def __init__(self, unknown=()):
        super().__init__()
        self.unknown, self.seen = set(unknown), []

    def score(self, requests, view="segment"):
        self.seen.extend(requests)
        got = super().score(requests, view)
        return [None if k in self.unknown else s for k, s in enumerate(got)]


@pytest.fixture
def trainer_for(tmp_path):
    made = []

    def make(method, **extra):
        t = build_trainer(_cfg(tmp_path / f"{method}{len(made)}", method, **extra))
        made.append(t)
        t.ctx.generator = SpyGenerator(t.ctx.generator)
        return t
    yield make
    for t in made:
        t.lock.release()


class ScriptedGenerator(SpyGenerator):
    """Returns, for each problem, its reference / first result wrong / no answer (finished rollouts)."""

    def generate(self, prompts, n, params, prefixes=None):
        self.prompts.extend(prompts)
        out = []
        for msgs in prompts:
            ref = next(p.reference_solution for p in self.problems if list(p.messages) == list(msgs))
            texts = [ref, ref.replace(" = ", " = 1", 1), ref.split(" answer ")[0]][:n]
            group = []
            for text in texts:
                ids = self.inner.encode_response(text)
                group.append(Rollout(list(msgs), self.inner.encode_prompt(list(msgs)), ids,
                                     self.inner.decode_response(ids), [-0.5] * len(ids)))
            out.append(group)
        return out


def test_process_step_puts_segment_advantages_on_every_token_and_excludes_unknowns(trainer_for, monkeypatch):
    t = trainer_for("exprl_process", segment_view="segment")
    ctx = t.ctx
    problems = t.sampler.next_batch()
    ctx.generator = ScriptedGenerator(ctx.generator.inner)
    ctx.generator.problems = problems
    ctx.reference_judge = ScriptedJudge(unknown={0})
    captured = {}
    real_train = ctx.policy.train

    def spy_train(batch, loss_fn):
        captured.update(batch)
        return real_train(batch, loss_fn)

    monkeypatch.setattr(ctx.policy, "train", spy_train)
    metrics = reasoning_train_step(ctx, problems, 1)
    assert metrics["judge/unknown_excluded"] == 1 and metrics["exprl/truncated_zero"] == 0
    assert metrics["exprl/judged_rollouts"] == 6 and metrics["judge/step_calls"] == 6  # one call per rollout
    assert captured["input_ids"].shape[0] == 5  # the unknown rollout (problem 0, sample 0) is not trained on
    adv, mask = captured["token_advantages"], captured["token_mask"].bool()
    assert torch.all(adv[~mask] == 0)
    assert float(captured["advantages"].abs().sum()) == 0.0  # no group normalisation: token advantages only
    from rise_nemo.data.chain_task import reference_segment_scores

    tok = find_tokenizer(ctx.generator)
    row = 0
    for i, p in enumerate(problems):
        for j, text in enumerate([p.reference_solution, p.reference_solution.replace(" = ", " = 1", 1),
                                  p.reference_solution.split(" answer ")[0]]):
            if (i, j) == (0, 0):
                continue
            ids = ctx.generator.inner.encode_response(text)
            spans, texts = exprl.rollout_segments(tok, Rollout([], [], ids, text, []), "step")
            s = [(x - 1) / 4 for x in reference_segment_scores(p.reference_solution, texts, "segment")]
            want = token_process_advantages(spans, s, len(ids))
            got = adv[row][mask[row]]
            assert torch.allclose(got, want), (i, j, got, want)
            row += 1


def test_process_advantages_match_the_formula_for_a_known_rollout(trainer_for):
    t = trainer_for("exprl_process", segment_view="prefix", truncated="zero")
    ctx = t.ctx
    p = t.sampler.next_batch()[0]
    gen = ctx.generator
    ids = gen.encode_response(p.reference_solution.replace(" = ", " = 1", 1))  # first result wrong
    r = Rollout(list(p.messages), gen.encode_prompt(list(p.messages)), ids, gen.decode_response(ids), [0.0] * len(ids))
    trunc = Rollout(list(p.messages), r.prompt_token_ids, ids[:3], gen.decode_response(ids[:3]), [0.0] * 3, finished=False)
    scored = ctx.score([p], [[r, trunc]])
    spans, texts = exprl.rollout_segments(find_tokenizer(gen), r, "step")
    assert len(spans) == p.difficulty and texts[0].startswith("step a")
    from rise_nemo.data.chain_task import reference_segment_scores

    s = [(x - 1) / 4 for x in reference_segment_scores(p.reference_solution, texts, "prefix")]
    want = [s[0] - s[-1]] + [s[k] - s[k - 1] for k in range(1, len(s))]
    adv = scored.token_advantages[0, 0]
    for (a, b), w in zip(spans, want):
        assert torch.allclose(adv[a:b], torch.full((b - a,), w))
    assert bool(scored.valid[0, 1]) and float(scored.rewards[0, 1]) == 0.0  # truncated: kept, scored 0
    assert torch.all(scored.token_advantages[0, 1] == 0)


def test_outcome_unknown_is_excluded_from_group_statistics_and_truncated_scores_zero(trainer_for):
    t = trainer_for("exprl_outcome", truncated="zero")
    ctx = t.ctx
    ctx.reference_judge = ScriptedJudge(unknown={1})
    p = t.sampler.next_batch()[0]
    gen = ctx.generator
    good = gen.encode_response(p.reference_solution)
    mk = lambda ids, fin=True: Rollout(list(p.messages), gen.encode_prompt(list(p.messages)), ids,  # noqa: E731
                                       gen.decode_response(ids), [0.0] * len(ids), finished=fin)
    scored = ctx.score([p], [[mk(good), mk(good), mk(good[:2], False)]])
    assert scored.valid.tolist() == [[True, False, True]]
    assert scored.rewards[0, 0] == 1.0 and scored.rewards[0, 2] == 0.0
    assert len(ctx.reference_judge.seen) == 2  # the truncated rollout never reaches the judge
    from rise_nemo.core.advantages import group_advantages

    adv = group_advantages(scored.rewards, valid=scored.valid)
    assert adv[0, 1] == 0 and adv[0, 0] > 0 > adv[0, 2]  # statistics over the 2 known rollouts only


@pytest.mark.parametrize("rule", ["judge", "zero"])
@pytest.mark.parametrize("method", ["exprl_outcome", "exprl_process"])
def test_truncated_rollouts_follow_one_rule_in_both_modes(trainer_for, method, rule):
    """``judge`` (the default): a truncated rollout is graded on what it wrote, like a
    finished one, in both modes: a truncated copy of a rollout gets the finished one's reward (outcome) and its
    segment advantages (process). ``zero`` (the embedded recipes' setting): no judge call, score 0, which is a
    reward of 0 in outcome mode and all-zero advantages in process mode."""
    t = trainer_for(method, truncated=rule) if rule != "judge" else trainer_for(method)
    ctx = t.ctx
    ctx.reference_judge = ScriptedJudge()
    p = t.sampler.next_batch()[0]
    gen = ctx.generator
    ids = gen.encode_response(p.reference_solution.split(" answer ")[0])  # every step right, no answer: 2..4
    mk = lambda toks, fin: Rollout(list(p.messages), gen.encode_prompt(list(p.messages)), toks,  # noqa: E731
                                   gen.decode_response(toks), [0.0] * len(toks), finished=fin)
    scored = ctx.score([p], [[mk(ids, True), mk(ids[:-1], False)]])  # the same text, no EOS
    assert scored.valid.tolist() == [[True, True]] and scored.metrics["exprl/truncated"] == 1
    assert len(ctx.reference_judge.seen) == (2 if rule == "judge" else 1)
    assert 0 < float(scored.rewards[0, 0]) < 1
    if method == "exprl_outcome":
        assert float(scored.rewards[0, 1]) == (float(scored.rewards[0, 0]) if rule == "judge" else 0.0)
    else:
        finished, truncated = scored.token_advantages[0, 0], scored.token_advantages[0, 1]
        assert finished.abs().sum() > 0
        want = finished[:-1] if rule == "judge" else torch.zeros(len(ids) - 1)
        assert torch.equal(truncated, want)


@pytest.mark.parametrize("method", ["exprl_outcome", "exprl_process", "self_distillation", "sft"])
def test_the_policy_never_sees_the_reference(trainer_for, method):
    t = trainer_for(method)
    ctx = t.ctx
    judge = ScriptedJudge()
    if method.startswith("exprl"):
        ctx.reference_judge = judge
    problems = t.sampler.next_batch()
    t._train_step(ctx, problems, 1)  # the method's registered step (SFT: no sampling)
    sampled = ctx.generator.prompts
    if method == "sft":
        assert sampled == []  # SFT does not sample
    else:
        assert sampled == [list(p.messages) for p in problems]
    for prompt in sampled:
        for p in problems:
            assert p.reference_solution not in str(prompt)
    for req in judge.seen:  # the judge gets the problem, the rollout and the reference: nothing else
        assert req.problem in problems


def test_self_distillation_teacher_is_the_policy_with_the_reference_in_context(trainer_for):
    t = trainer_for("self_distillation")
    p = t.sampler.next_batch()[0]
    msgs = exprl.teacher_messages(p, "")
    assert msgs[-1]["content"] == p.messages[-1]["content"] + " " + p.reference_solution
    assert exprl.teacher_messages(p, "Reference solution:")[-1]["content"].endswith(
        "Reference solution: " + p.reference_solution)
    metrics = reasoning_train_step(t.ctx, [p], 1)
    assert metrics["distill/reverse_kl"] is not None and metrics["loss/kl"] is not None


def test_sft_step_lowers_the_reference_nll(trainer_for):
    t = trainer_for("sft")
    problems = t.sampler.next_batch()
    losses = [t.ctx.method.training_step().train_step(t.ctx, problems, k)["sft/nll"] for k in range(1, 6)]
    assert losses[-1] < losses[0]


def test_sft_run_writes_its_reference_rows_to_samples_jsonl(tmp_path):
    """Nothing is sampled in SFT, but samples.jsonl still says what each step trained on: the references."""
    import json

    t = build_trainer(_cfg(tmp_path / "sft", "sft"))
    assert t.run() == 0
    records = [json.loads(line) for line in (tmp_path / "sft" / "samples.jsonl").read_text().splitlines()]
    references = {p.prompt_id: p.reference_solution for p in t.sampler.prompts}
    assert [r["step"] for r in records] == sorted(r["step"] for r in records) and {r["step"] for r in records} == {1, 2}
    for r in records:
        assert r["kind"] == "sft_reference" and r["response"] == references[r["prompt_id"]]
        assert r["sampled_tokens"] == 0 and r["trained_tokens"] > 0


def test_method_registry_settings():
    o, p = get_method("exprl_outcome"), get_method("exprl_process")
    assert o.defaults["policy_loss.kl_coef"] == p.defaults["policy_loss.kl_coef"] == 0.001
    assert (o.defaults["policy_loss.clip_low"], o.defaults["policy_loss.clip_high"]) == (0.2, 0.28)
    assert (p.defaults["policy_loss.clip_low"], p.defaults["policy_loss.clip_high"]) == (0.2, 0.26)
    assert o.defaults["sampling.temperature"] == 0.8
    with pytest.raises(ValueError, match="reference judge"):
        ReasoningContext(cfg=None, policy=None, generator=None, verifier=None, method=p)


@pytest.mark.parametrize("method", ["exprl_outcome", "exprl_process"])
def test_resumed_exprl_run_reproduces_the_uninterrupted_run(tmp_path, method):
    full, parts = tmp_path / "full", tmp_path / "parts"
    assert build_trainer(_cfg(full, method)).run() == 0
    assert build_trainer(_cfg(parts, method), stop_after=1).run() == 0
    assert build_trainer(_cfg(parts, method)).run() == 0

    def rep(run):
        return [{k: v for k, v in m.items() if not k.startswith(("time/", "judge/"))} for m in read_metrics(run)]
    assert rep(full) == rep(parts)
    assert read_metrics(full)[0]["loss/kl"] is not None  # k3 KL 0.001 by the method's defaults


def test_reasoning_jsonl_gives_problems_with_references_and_a_math_verifier(tmp_path):
    """A NeMo-RL ExpRL recipe's data path: reasoning files load as ReasoningProblems (reference solutions
    included) and are verified by math-verify; rubric methods keep the rubric loader."""
    import json

    from rise_nemo.loop.data import load_prompts
    from rise_nemo.steps.verifiers import build_verifier

    rows = [{"problem": f"What is {k} + {k}?", "solution": f"### Step 1\nAdd: $\\\\boxed{{{2 * k}}}$"} for k in range(3)]
    path = tmp_path / "math.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = config_from_dict({"method": "exprl_process", "data": {"source": "jsonl", "format": "math",
                                                               "train_path": str(path), "eval_path": str(path)}})
    train, held = load_prompts(cfg)
    assert len(train) == len(held) == 3 and train[0].reference_solution.startswith("### Step 1")
    verifier, step_acc = build_verifier(cfg)
    assert step_acc is None
    assert verifier.verify(train[:2], ["so \\\\boxed{0}", "\\\\boxed{7}"]) == [True, False]


def test_nemo_export_arguments_name_the_final_checkpoint(tmp_path):
    import yaml

    from rise_nemo.commands.export import export_arguments
    from rise_nemo.errors import UserError

    run = tmp_path / "stage1"
    run.mkdir()
    with pytest.raises(UserError, match="no config.yaml"):
        export_arguments(run, tmp_path / "hf")
    (run / "config.yaml").write_text(yaml.safe_dump({"nemo": {"policy": {"model_name": "Qwen/Qwen3-4B-Instruct-2507",
                                                                        "tokenizer": {"name": "tok"}}}}))
    with pytest.raises(UserError, match="no complete checkpoint"):
        export_arguments(run, tmp_path / "hf")
    for step in (10, 20):
        d = run / "checkpoints" / f"step_{step:06d}"
        d.mkdir(parents=True)
        (d / "trainer.pt").write_bytes(b"x")
        (d / "COMPLETE").write_text(f"{step}\n")
    args = export_arguments(run, tmp_path / "hf")
    assert args["input_path"].endswith("step_000020/policy/weights")
    assert (args["hf_model_name"], args["hf_tokenizer_path"]) == ("Qwen/Qwen3-4B-Instruct-2507", "tok")
    (run / "config.yaml").write_text(yaml.safe_dump({"method": "grpo"}))
    with pytest.raises(UserError, match="no nemo.policy.model_name"):
        export_arguments(run, tmp_path / "hf")
