"""The cluster path on CPU: the nemo backend against stand-ins that mimic NeMo-RL v0.7.0
(commit 81aa43dda4765b0429cf31dab44441e4e4383911) where each defect lived. The same checks against NeMo-RL's
real source are in test_with_nemo_rl.py (its "cluster-path defects" section)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))

from cpu_nemo import CpuMegatronPolicy, CpuVllm, make_prompts, make_tokenizer, master_config, write_jsonl  # noqa: E402

from rise_nemo.backends.nemo import _policy_with_resume  # noqa: E402
from rise_nemo.backends.nemo.config import NemoConfigError, validate_nemo_block  # noqa: E402
from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoPolicy, NemoSession  # noqa: E402
from rise_nemo.config import config_from_dict  # noqa: E402
from rise_nemo.interfaces import KIND_NATURAL, SamplingParams  # noqa: E402
from rise_nemo.judges import build_judge  # noqa: E402
from rise_nemo.loop.trainer import Trainer  # noqa: E402

torch.set_num_threads(1)
MAX_NEW = 10
REPO = Path(__file__).resolve().parents[2]


class MegatronLikePolicy(CpuMegatronPolicy):
    """CpuMegatronPolicy plus the three NeMo-RL behaviours these tests are about:

    - weights location: a colocated refit ends with ``offload_after_refit`` (grpo.py:1961-1962), which moves
      the model to the CPU (megatron_policy_worker.py:1578-1585); ``prepare_for_training`` /
      ``prepare_for_lp_inference`` move it back (:1411-1450). Saving offloaded weights is refused here.
    - checkpoints: ``save_checkpoint`` hands the optimizer to Megatron's save, which writes its state into
      ``weights/iter_0000000/common.pt`` (megatron_policy_worker.py:1704-1724); no ``optimizer`` directory.
    - LR scheduler: Megatron-Bridge sizes warmup as lr_warmup_iters x train_global_batch_size samples and
      the worker steps it once per train() call with ``increment=gbs`` (megatron_policy_worker.py:801-806).
    """

    def __init__(self, *a, global_batch: int, warmup_iters: int = 4, max_lr: float = 1.0, **k):
        super().__init__(*a, **k)
        self.on_gpu = True
        self.warmup_samples = warmup_iters * global_batch
        self.scheduler_samples = 0
        self.max_lr = max_lr
        self.expected_prev: list[torch.Tensor] = []

    def lr(self) -> float:
        return self.max_lr * min(1.0, self.scheduler_samples / self.warmup_samples)

    def offload_before_refit(self):
        self.events.append("policy.offload_before_refit")

    def offload_after_refit(self):
        super().offload_after_refit()
        self.on_gpu = False

    def prepare_for_training(self):
        super().prepare_for_training()
        self.on_gpu = True

    def prepare_for_lp_inference(self):
        super().prepare_for_lp_inference()
        self.on_gpu = True

    def train(self, data, loss_fn, gbs=None, mbs=None):
        assert self.on_gpu, "Megatron train with offloaded weights"
        self.expected_prev.append(self._aligned(data["input_ids"]))  # the trainer's log-probs before the update
        out = super().train(data, loss_fn, gbs=gbs, mbs=mbs)
        self.scheduler_samples += gbs  # scheduler.step(increment=gbs), once per train() call
        return out

    def save_checkpoint(self, weights_path, optimizer_path=None, tokenizer_path=None, checkpointing_cfg=None):
        assert self.on_gpu, "save_checkpoint while the Megatron weights are offloaded to the CPU"
        super().save_checkpoint(weights_path, optimizer_path, tokenizer_path)
        common = Path(weights_path) / "iter_0000000" / "common.pt"
        common.parent.mkdir(parents=True, exist_ok=True)
        state = {"iteration": 0}
        if optimizer_path is not None:
            state["optimizer"] = {"param_groups": [{"lr": self.lr()}]}
            state["opt_param_scheduler"] = {"num_steps": self.scheduler_samples}
        torch.save(state, common)


def refit(policy, generation, colocated, _refit_buffer_size_gb=None, **_):
    """grpo.refit_policy_generation's policy-side calls (grpo.py:1876, 1961-1966) on the stand-ins."""
    if colocated:
        policy.offload_before_refit()
    generation.model.load_state_dict({k: v.clone() for k, v in policy.model.state_dict().items()})
    if colocated:
        policy.offload_after_refit()
    generation.prepare_for_generation()


def backend(global_batch=32, behaviour_ratio=False):
    events: list[str] = []
    tok = make_tokenizer()
    cfg = master_config(MAX_NEW, mbs=2)
    cfg["policy"]["train_global_batch_size"] = global_batch
    policy = MegatronLikePolicy(len(tok), 2, events, global_batch=global_batch)
    vllm = CpuVllm(len(tok), MAX_NEW, tok.pad_token_id, tok.eos_token_id, events)
    session = NemoSession(policy, vllm, tok, cfg, refit=refit, to_batched=dict)
    return NemoPolicy(session, behaviour_ratio), NemoGenerator(session), policy


def recipe(run_dir: Path, method: str, steps: int) -> dict:
    return {
        "run": {"name": "cluster_path", "dir": str(run_dir), "seed": 3},
        "backend": "nemo", "method": method,
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": MAX_NEW},
        "rise": {"lambda_guide": 0.2, "privileged_group_size": 4, "schedule": {"mode": "fixed", "switch_step": 50}},
        "data": {"source": "persistent"}, "judge": {"type": "rule"},
        "train": {"steps": steps, "checkpoint_every": 1, "progress": False, "keep_checkpoints": 0},
        "eval": {"every": 1, "at_start": False, "samples_per_prompt": 2},
        "nemo": {"plan": {"nodes": 1}},
    }


def run(tmp_path, method, steps=2, behaviour_ratio=False):
    policy, generator, fake = backend(behaviour_ratio=behaviour_ratio)
    cfg = config_from_dict(recipe(tmp_path, method, steps))
    trainer = Trainer(cfg, policy, generator, build_judge(cfg.judge), make_prompts(4), make_prompts(2, 4),
                      run_dir=tmp_path)
    assert trainer.run() == 0
    return fake


# -- resume must load Megatron's embedded optimizer -------------------------------------------------


def test_item1_resume_loads_the_optimizer_megatron_embedded_in_the_weights(tmp_path):
    from rise_nemo.backends.nemo import resume_paths

    policy, generator, fake = backend()
    policy.save_checkpoint(tmp_path / "step_000002" / "policy")
    policy_dir = tmp_path / "step_000002" / "policy"
    assert not (policy_dir / "optimizer").exists()  # Megatron never writes it
    seen = {}
    _policy_with_resume(lambda **k: seen.update(k), policy_dir)
    assert seen["weights_path"] == str(policy_dir / "weights")
    assert seen["optimizer_path"] is not None  # load_optim=optimizer_path is not None (megatron/setup.py:918)
    # DTensor layout (separate optimizer dir) and a checkpoint saved without optimizer state:
    dtensor = tmp_path / "dt" / "policy"
    (dtensor / "optimizer").mkdir(parents=True)
    assert resume_paths(dtensor) == (str(dtensor / "weights"), str(dtensor / "optimizer"))
    bare = tmp_path / "bare" / "policy"
    (bare / "weights" / "iter_0000000").mkdir(parents=True)
    torch.save({"iteration": 0}, bare / "weights" / "iter_0000000" / "common.pt")
    assert resume_paths(bare) == (str(bare / "weights"), None)


# -- save after an evaluation's refit ---------------------------------------------------------------


def test_item2_save_after_a_generation_window_reloads_the_weights(tmp_path):
    policy, generator, fake = backend()
    generator.generate([list(p.messages) for p in make_prompts(2)], 2, SamplingParams(MAX_NEW, 1.0, 1.0))
    assert not fake.on_gpu  # the refit offloaded Megatron (colocated)
    policy.save_checkpoint(tmp_path / "policy")
    assert fake.events[-2:] == ["policy.prepare_for_training", "policy.save_checkpoint"]


def test_item2_train_eval_save_order_in_the_loop(tmp_path):
    fake = run(tmp_path, "rise", steps=2)  # eval.every=1 and checkpoint_every=1: train -> eval -> save
    ev = fake.events
    for i, e in enumerate(ev):
        if e == "policy.save_checkpoint":
            last_refit = max(j for j in range(i) if ev[j] == "policy.offload_before_refit")
            assert "policy.prepare_for_training" in ev[last_refit:i]
    assert ev.count("policy.save_checkpoint") == 2


# -- the OPD baseline checkpoints ---------------------------------------------------------------------


@pytest.mark.parametrize("name", ["opd_14b_teacher32b.yaml", "opd_4b_teacher14b.yaml"])
def test_item3_opd_recipes_checkpoint_with_nemo_rl(name):
    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.config import checkpointing_values
    from rise_nemo.config.loader import load_config

    tree = plain_recipe(load_config(REPO / "recipes" / name))
    validate_nemo_block(tree)
    ck = checkpointing_values(tree)
    every, keep, steps = tree["train"]["checkpoint_every"], tree["train"]["keep_checkpoints"], tree["train"]["steps"]
    assert ck == {"checkpointing.enabled": True, "checkpointing.save_period": every or steps,
                  "checkpointing.keep_top_k": keep or steps, "checkpointing.metric_name": None}
    # NeMo-RL's save rule (distillation.py:950-961): (step + 1) % save_period == 0 or the last step.
    saved = [s for s in range(steps) if ck["checkpointing.enabled"]
             and ((s + 1) % ck["checkpointing.save_period"] == 0 or s == steps - 1)]
    assert saved and saved[-1] == steps - 1
    tree["train"]["keep_checkpoints"] = 0  # keep all: an int NeMo-RL's MasterConfig accepts, never None
    assert checkpointing_values(tree)["checkpointing.keep_top_k"] == steps
    tree["nemo"]["checkpointing"] = {"enabled": False}
    with pytest.raises(NemoConfigError, match="nemo.checkpointing.enabled is set from train.checkpoint_every"):
        validate_nemo_block(tree)


def test_item3_grpo_recipes_keep_nemo_rl_checkpointing_off():
    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.backends.nemo.config import checkpointing_values
    from rise_nemo.config.loader import load_config

    tree = plain_recipe(load_config(REPO / "recipes" / "rise_14b.yaml"))
    assert checkpointing_values(tree) == {"checkpointing.enabled": False}  # rise_nemo's own loop saves


# -- `rise-nemo eval` loads an OPD checkpoint; resume and eval choose by one rule ---------


def nemo_rl_save(run_dir: Path, step: int, policy: CpuMegatronPolicy, finish: bool = True) -> Path:
    """What distillation_train + NeMo-RL's CheckpointManager leave for one save (distillation.py:1003-1029):
    init_tmp_checkpoint writes tmp_step_N/training_info.json (utils/checkpoint.py:208-237), the student saves
    policy/{weights,optimizer,tokenizer}, the dataloader state is saved, and finalize_checkpoint renames
    tmp_step_N to step_N (utils/checkpoint.py:239-266). ``finish=False`` leaves a save cut off by a kill."""
    import json

    tmp = run_dir / "nemo_rl_checkpoints" / f"tmp_step_{step}"
    tmp.mkdir(parents=True)
    (tmp / "training_info.json").write_text(json.dumps({"current_step": step, "total_steps": step,
                                                        "consumed_samples": 512 * step}))
    policy.save_checkpoint(weights_path=str(tmp / "policy" / "weights"),
                           optimizer_path=str(tmp / "policy" / "optimizer"),
                           tokenizer_path=str(tmp / "policy" / "tokenizer"))
    torch.save({}, tmp / "train_dataloader.pt")
    if not finish:
        return tmp
    final = tmp.parent / f"step_{step}"
    tmp.rename(final)
    return final


def test_item3_opd_checkpoint_is_the_one_nemo_rl_resumes_from(tmp_path):
    """NeMo-RL's distillation resumes from the step_N with the highest N (get_latest_checkpoint_path,
    utils/checkpoint.py:357-373, re.fullmatch(r"step_\\d+")): numeric, not lexical, order; tmp_step_* (a
    save cut off) and old_step_* ignored. `rise-nemo eval` takes the same one by default, and names resolve
    in that directory."""
    from rise_nemo.backends.nemo.checkpoints import NEMO_RL_LAYOUT, latest_nemo_rl_checkpoint
    from rise_nemo.errors import UserError
    from rise_nemo.loop.checkpoint import resolve_checkpoint

    tok = make_tokenizer()
    student = CpuMegatronPolicy(len(tok), 1, [])
    for step in (2, 9, 10):
        nemo_rl_save(tmp_path, step, student)
    nemo_rl_save(tmp_path, 12, student, finish=False)
    (tmp_path / "nemo_rl_checkpoints" / "old_step_11").mkdir()
    root = tmp_path / "nemo_rl_checkpoints"
    assert latest_nemo_rl_checkpoint(tmp_path) == root / "step_10"
    assert resolve_checkpoint(tmp_path, None, NEMO_RL_LAYOUT) == root / "step_10"
    for name in ("9", "step_9", "step_000009", str(root / "step_9")):
        assert resolve_checkpoint(tmp_path, name, NEMO_RL_LAYOUT) == root / "step_9", name
    with pytest.raises(UserError, match=r"--checkpoint 12: no complete checkpoint .* step_2, step_9, step_10"):
        resolve_checkpoint(tmp_path, "12", NEMO_RL_LAYOUT)  # the unfinished save is not offered
    assert latest_nemo_rl_checkpoint(tmp_path / "none") is None


def fake_nemo_build(built: list):
    """Stand-in for NeMo-RL's Policy construction in build_backend()/build_student(): like ``Policy(weights_path=)``
    it loads the checkpoint's weights when the policy is created, and records which checkpoint it was."""
    from rise_nemo.backends.nemo.checkpoints import policy_dir

    def build(recipe, checkpoint):
        policy, generator, fake = backend()
        resume = policy_dir(checkpoint)
        if resume is not None:
            fake.model.load_state_dict(torch.load(resume / "weights" / "model.pt"))
        policy.session.resumed_from = resume
        built.append(checkpoint)
        return policy, generator

    return build


@pytest.mark.parametrize("choice", [None, "2"])
def test_item3_eval_scores_the_opd_student_of_a_nemo_rl_checkpoint(tmp_path, monkeypatch, capsys, choice):
    """`rise-nemo eval RUN_DIR` on an OPD run: the config.yaml the distill entry point writes, the newest
    NeMo-RL checkpoint (or --checkpoint), the student built from its weights, the step from training_info.json.
    Before: build() refused every distillation recipe."""
    import json

    import rise_nemo.backends.nemo as nemo_backend
    from rise_nemo.cli import main
    from rise_nemo.config.loader import load_config, to_yaml
    from rise_nemo.loop.rundir import write_config

    run_dir = tmp_path / "opd"
    cfg = load_config(REPO / "recipes" / "opd_4b_teacher14b.yaml", [
        f"run.dir={run_dir}", "judge={type: rule}", "eval.samples_per_prompt=2", f"sampling.max_new_tokens={MAX_NEW}",
        f"data.train_path={write_jsonl(tmp_path / 'train.jsonl', make_prompts(4))}",
        f"data.eval_path={write_jsonl(tmp_path / 'eval.jsonl', make_prompts(2, 4))}",
    ])
    run_dir.mkdir()
    write_config(run_dir, cfg, 0)  # what the distill entry point writes (tested against NeMo-RL in tests/nemo)
    assert "algorithm: distillation" in to_yaml(cfg)
    tok = make_tokenizer()
    students = {}
    for step in (1, 2, 3):
        students[step] = CpuMegatronPolicy(len(tok), 1, [])
        students[step].model.load_state_dict({"table": torch.full_like(students[step].model.table, float(step))})
        nemo_rl_save(run_dir, step, students[step])
    built: list = []
    monkeypatch.setattr(nemo_backend, "build_student", fake_nemo_build(built))
    args = ["eval", str(run_dir)] + (["--checkpoint", choice] if choice else [])
    assert main(args) == 0
    step = 3 if choice is None else int(choice)
    assert built == [run_dir / "nemo_rl_checkpoints" / f"step_{step}"]
    result = json.loads((run_dir / "eval" / "cli" / f"step_{step:06d}.json").read_text())  # never the trainer's
    assert result["step"] == step and result["num_prompts"] == 2
    assert f"step {step}: mean reward" in capsys.readouterr().out


def test_item3_eval_of_a_grpo_run_builds_the_policy_from_the_chosen_checkpoint(tmp_path, monkeypatch):
    """NeMo-RL loads weights only when the Policy is created, so the checkpoint is chosen before build():
    `rise-nemo eval --checkpoint 1` builds from step 1 (before: build() always took the latest, and the
    step-1 eval failed with "policy was built from .../step_000002"), and a resume builds from the latest
    of the run directory it resumes (also under --run-dir, which run.dir does not name)."""
    import rise_nemo.backends.nemo as nemo_backend
    from rise_nemo.cli import main
    from rise_nemo.config.loader import to_yaml
    from rise_nemo.loop.run import build_trainer

    tree = recipe(tmp_path / "elsewhere", "rise", steps=2)
    tree["data"] = {"source": "jsonl", "train_path": write_jsonl(tmp_path / "train.jsonl", make_prompts(4)),
                    "eval_path": write_jsonl(tmp_path / "eval.jsonl", make_prompts(2, 4))}
    run_dir = tmp_path / "run"
    policy, generator, _ = backend()
    cfg = config_from_dict(tree)
    Trainer(cfg, policy, generator, build_judge(cfg.judge), make_prompts(4), make_prompts(2, 4), run_dir=run_dir).run()
    assert (run_dir / "config.yaml").is_file() and "nemo" in to_yaml(cfg)
    built: list = []
    fake = fake_nemo_build(built)
    monkeypatch.setattr(nemo_backend, "build_backend",
                        lambda cfg, checkpoint=None, train_prompts=None: fake(None, checkpoint))
    assert main(["eval", str(run_dir), "--checkpoint", "1"]) == 0
    assert built == [run_dir / "checkpoints" / "step_000001"]
    assert (run_dir / "eval" / "cli" / "step_000001.json").is_file()
    trainer = build_trainer(cfg, run_dir=run_dir)  # what `rise-nemo train --run-dir RUN` builds
    try:
        assert built[-1] == run_dir / "checkpoints" / "step_000002"
    finally:
        trainer.lock.release()


# -- each row's PPO reference under behaviour_ratio, for every method ---------------------------------


@pytest.mark.parametrize("method", ["rise", "uniform", "coupled", "ruscarl", "rubric_rl"])
def test_item4_ppo_reference_is_the_sampler_only_for_rows_sampled_under_the_train_prompt(tmp_path, method):
    fake = run(tmp_path, method, steps=1, behaviour_ratio=True)
    data, recomputed = fake.train_calls[0], fake.expected_prev[0]
    real = data["sample_mask"].bool()
    own = data["sampled_under_train_prompt"].bool() & real
    tokens = data["token_mask"].bool()
    mask_own, mask_other = own[:, None] & tokens, (real & ~own)[:, None] & tokens
    torch.testing.assert_close(data["prev_logprobs"][mask_own], data["generation_logprobs"][mask_own])
    torch.testing.assert_close(data["prev_logprobs"][mask_other], recomputed[mask_other])
    assert bool((data["prev_logprobs"][mask_other] < 0).all())  # never a 0.0 placeholder as pi_old
    natural = real & (data["kind"] == KIND_NATURAL)
    if method in ("rise", "uniform", "rubric_rl"):
        assert bool(own[natural].all()) and not bool(own[real & ~natural].any())
    elif method == "ruscarl":
        assert not bool(own.any())  # sampled under scaffolds, trained under the original prompt
    else:  # coupled: privileged rows join the natural group but were sampled under the hinted prompt
        assert 0 < int((natural & ~own).sum()) and int((natural & own).sum()) == 8


# -- LR warmup in optimiser steps ------------------------------------------------------------------


def test_item6_scheduler_advances_one_iteration_per_step_whatever_the_rows(tmp_path):
    fake = run(tmp_path, "rise", steps=3)
    rows = [int(d["sample_mask"].sum()) for d in fake.train_calls]
    assert len(set(rows)) > 1 or rows[0] < 32  # the steps had different (or fewer) real rows than the gbs
    assert [d["input_ids"].shape[0] for d in fake.train_calls] == [32, 32, 32]
    assert fake.scheduler_samples == 3 * 32  # three iterations of train_global_batch_size samples
    assert fake.lr() == pytest.approx(3 / 4)  # 3 of 4 warmup iterations done


def test_item6_too_many_rows_for_the_global_batch_is_a_named_error(tmp_path):
    from rise_nemo.backends.nemo.batch import BatchError, to_nemo_train_batch

    b, t = 6, 5
    batch = {"input_ids": torch.ones(b, t, dtype=torch.long), "input_lengths": torch.full((b,), t),
             "token_mask": torch.ones(b, t), "sample_mask": torch.ones(b), "advantages": torch.zeros(b),
             "kind": torch.zeros(b, dtype=torch.long), "prev_logprobs": torch.zeros(b, t)}
    with pytest.raises(BatchError, match="train_global_batch_size: this step has 6 training rows, more than 4"):
        to_nemo_train_batch(batch, 1, 2, 1, 0, False, global_batch_size=4)
    with pytest.raises(BatchError, match="train_global_batch_size: 6 is not a multiple of DP 2"):
        to_nemo_train_batch(batch, 2, 2, 1, 0, False, global_batch_size=6)
    out, rows = to_nemo_train_batch(batch, 2, 2, 1, 0, False, global_batch_size=8)
    assert rows == 6 and out["input_ids"].shape[0] == 8 and out["sample_mask"][6:].eq(0).all()
