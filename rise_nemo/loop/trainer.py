"""The training loop: steps, metrics, evaluation, checkpoints, resume and graceful stop.

Run directory (docs/CONTRACTS.md)::

    .lock              held (flock) while a trainer runs here: a second trainer is refused (rundir.py)
    config.yaml        resolved recipe, secrets redacted; config_history/ keeps replaced versions
    metrics.jsonl      one JSON object per step (the step's metrics: steps.rubric.step_metrics,
                       steps.reasoning.reasoning_metrics) + judge/* counters
    samples.jsonl      a few rollouts per step: prompt, hinted?, response, verdicts, reward, advantage, kind
                       (reasoning methods: prompt, difficulty, response, given/sampled tokens, reward, advantage)
    train.log          human-readable log: start, resume (step, SLURM_RESTART_COUNT), evals, signals
    checkpoints/       step_XXXXXX/ + latest (see checkpoint.py)
    eval/step_XXXXXX.json   guidance-free evaluations
    summary.json       written at the end: final step, last eval, guidance switch

Resume: ``run()`` loads the latest complete checkpoint (policy, optimiser, all RNG states, data position,
guidance schedule) and truncates ``metrics.jsonl`` to the steps it covers, so a kill after the last
checkpoint never leaves repeated steps. On CPU a resumed run reproduces the uninterrupted one exactly
(tests/orchestration/test_resume.py).
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rise_nemo.core.rubric import RubricPrompt
from rise_nemo.interfaces import CountingJudge, Critic, Generator, Judge, Policy, StatsJudge, Verifier
from rise_nemo.loop import checkpoint as ckpt
from rise_nemo.loop.data import PromptSampler
from rise_nemo.loop.gc_freeze import frozen_setup
from rise_nemo.loop.rundir import RunDirLock, write_config
from rise_nemo.loop.signals import StopFlag
from rise_nemo.methods.registry import Method, RunParts, get_method, load_step_implementations
from rise_nemo.steps.rollouts import pad_id_of
from rise_nemo.stopping import StopInterrupted

# The step kinds' steps and the scorers, advantage estimators and hooks they implement bind themselves to the
# registry when their modules are imported: all of rise_nemo.steps, here, so the trainer only asks the method.
load_step_implementations()

log = logging.getLogger("rise_nemo.train")

# Keys whose values depend on the process, not on the run: wall-clock times, and the judge's counters
# (``judge/calls``, ``judge/cache_hits``, ...: cumulative since this process started, so they restart at a
# resume). Everything else in metrics.jsonl, ``judge/unknown_excluded`` included, is reproducible.
TIMING_PREFIX = "time/"
JUDGE_COUNTER_PREFIX = "judge/"
STEP_JUDGE_KEYS = ("judge/unknown_excluded",)


def reproducible_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """``metrics`` without the process-dependent keys (what a resumed run reproduces exactly)."""
    return {k: v for k, v in metrics.items() if not k.startswith(TIMING_PREFIX)
            and (not k.startswith(JUDGE_COUNTER_PREFIX) or k in STEP_JUDGE_KEYS)}
def resolve_run_dir(cfg: Any) -> Path:
    return Path(cfg.run.dir) if cfg.run.dir else Path("runs") / str(cfg.run.name)


class Trainer:
    def __init__(
        self,
        cfg: Any,
        policy: Policy,
        generator: Generator,
        judge: Judge,
        train_prompts: Sequence[RubricPrompt],
        eval_prompts: Sequence[RubricPrompt],
        run_dir: str | Path | None = None,
        stop_after: int | None = None,
        lock: RunDirLock | None = None,
        config_changes: Sequence[tuple[str, Any, Any]] = (),
        critic: Critic | None = None,
        verifier: Verifier | None = None,
        step_accuracy: Any = None,
        reward_model: Any = None,
        method: Method | None = None,
    ):
        """``stop_after``: behave as if a stop signal arrived during that step (tests, bounded sessions).
        ``lock``: the run directory's lock if the caller already holds it (``build_trainer``); released at
        the end of ``run``. ``config_changes``: accepted differences from the run's earlier config (logged).

        Methods on problems (``Method.data``) take ``verifier`` (``judge``: ExpRL's reference judge or None),
        ``critic`` when the method trains one, and the task's ``step_accuracy`` checker for evaluation;
        ``reward_model`` (interfaces.RewardModel) when the recipe has a reward model. ``method``: the recipe's
        method as ``build_trainer`` resolved it (default: the registered method named ``cfg.method``); all of
        them go to the method's step (``build_context``), which keeps what it uses."""
        self.cfg = cfg
        self.run_dir = Path(run_dir) if run_dir is not None else resolve_run_dir(cfg)
        self.policy, self.generator, self.judge = policy, generator, judge
        self.eval_prompts = list(eval_prompts)
        self.steps = int(cfg.train.steps)
        self.sampler = PromptSampler(train_prompts, int(cfg.sampling.prompts_per_step), int(cfg.run.seed),
                                     bool(cfg.data.shuffle))
        self.method = method if method is not None else get_method(str(cfg.method))
        self.critic = critic
        self._train_prompts = list(train_prompts)
        # The method's step builds its context (rise_nemo.methods.registry.StepState): the step's
        # inputs and the method's own checkpointed state (RISE's schedule and gate, RRL's replay buffer).
        self._step_kind = self.method.training_step()
        self.ctx = self._step_kind.build_context(self.method, RunParts(
            cfg=cfg, policy=policy, generator=generator, judge=judge, verifier=verifier, critic=critic,
            step_accuracy=step_accuracy, n_train_problems=len(train_prompts), total_steps=self.steps,
            pad_id=pad_id_of(generator), rng=random.Random(int(cfg.run.seed)),
            samples_per_step=int(cfg.train.log_samples), reward_model=reward_model))
        self._train_step, self._progress_keys = self._step_kind.train_step, self._step_kind.progress_keys(self.method)
        self.lock = lock
        self.config_changes = list(config_changes)
        self.step = 0
        self.stop_after = stop_after
        self.stopped_by: str | None = None
        self._pending_eval = False  # resumed from a checkpoint whose evaluation a stop interrupted
        self._sinks: list[Any] = []

    # ------------------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Train to ``train.steps`` (resuming if a checkpoint exists). Returns 0, also after a signal."""
        lock = self.lock or RunDirLock(self.run_dir)
        lock.acquire()  # no-op when build_trainer already holds it
        handler = self._attach_log_file()
        try:
            seed_everything(int(self.cfg.run.seed))
            self.resume()
            self._write_config()
            log.info("start: method %s, backend %s, seed %s, steps %d -> %d, run directory %s%s",
                     self.cfg.method, self.cfg.backend, self.cfg.run.seed, self.step, self.steps,
                     self.run_dir.resolve(), " (resumed)" if self.step else "")
            for key, old, new in self.config_changes:
                log.info("config change from step %d: %s: %r -> %r", self.step + 1, key, old, new)
            self._open_sinks()
            self._pretrain_critic()
            # the setup's objects frozen: the steps' full garbage collections skip them (loop/gc_freeze.py)
            with frozen_setup(), StopFlag() as stop, self._progress() as bar:
                # A stop that makes a needed server fail (StopInterrupted, rise_nemo/stopping.py) ends the
                # loop at once; the checkpoint then holds the state from before the interrupted work.
                interrupted = False
                try:
                    if self._pending_eval:  # the previous attempt was stopped during this evaluation
                        self._interruptible_eval(self.step)
                    elif self.step == 0 and self.cfg.eval.at_start and self.eval_prompts:
                        self.run_eval(0)
                    while self.step < self.steps and not stop.requested:
                        self._interruptible_step(bar)
                        if self.stop_after is not None and self.step >= self.stop_after and not stop.requested:
                            stop.request(f"stop_after={self.stop_after}")
                        if self._eval_due(self.step):
                            self._interruptible_eval(self.step)
                        if self._checkpoint_due(self.step) or stop.requested:
                            self.save()
                except StopInterrupted:
                    if not stop.requested:
                        raise
                    interrupted = True
                if stop.requested and (self.step < self.steps or interrupted):
                    self.stopped_by = stop.requested
                    if self.step == 0:  # stopped during the initial evaluation: nothing trained, nothing to save
                        log.info("received %s before the first step; exiting 0 without a checkpoint", stop.requested)
                    else:
                        log.info("received %s: stopped after step %d with a complete checkpoint; exiting 0",
                                 stop.requested, self.step)
                    return 0
            self._write_summary()
            log.info("finished %d steps in %s", self.steps, self.run_dir)
            return 0
        finally:
            self._close_sinks()
            logging.getLogger("rise_nemo").removeHandler(handler)
            handler.close()
            lock.release()

    def _interruptible_step(self, bar: Any) -> None:
        """One training step. If a stop request makes a server it needs fail (StopInterrupted: on a Slurm
        requeue or preemption the judge servers are killed with the job), the step is abandoned and the
        state from before it is checkpointed: every server call of a step comes before its policy update
        (rise_nemo.steps), so the policy still is the previous step's. Re-raises for ``run`` to stop."""
        before = self._resume_state()
        self.step += 1
        try:
            metrics = self._train_step(self.ctx, self.sampler.next_batch(), self.step)
        except StopInterrupted as exc:
            self.step -= 1
            log.warning("step %d abandoned: %s", self.step + 1, exc)
            self._save_state(before)
            raise
        self._log_metrics(metrics, bar)

    def _interruptible_eval(self, step: int) -> None:
        """``run_eval``; when a stop interrupts it (as above), the checkpoint of ``step`` holds the state
        from before the evaluation and marks it pending, so the resumed run evaluates first, with the same
        random state as an uninterrupted run."""
        before = self._resume_state(pending_eval=True)
        try:
            self.run_eval(step)
        except StopInterrupted as exc:
            log.warning("evaluation at step %d interrupted, pending for the resumed run: %s", step, exc)
            self._save_state(before)
            raise
        self._pending_eval = False

    def _resume_state(self, pending_eval: bool = False) -> dict[str, Any]:
        """A copy of the trainer state now (the live objects keep changing during the step)."""
        return copy.deepcopy({**self.trainer_state(), "pending_eval": pending_eval})

    def _save_state(self, state: dict[str, Any]) -> None:
        """Checkpoints the current policy with ``state`` unless nothing was trained yet or that checkpoint
        exists already (``train.checkpoint_every`` wrote it)."""
        step = int(state["step"])
        latest = ckpt.latest_checkpoint(self.run_dir)
        if (step == 0 and not state["pending_eval"]) or (
                not state["pending_eval"] and latest is not None and latest.name == ckpt.step_dir_name(step)):
            return
        self.save(state)

    # ------------------------------------------------------------------------------------------------------
    # Checkpoints

    def trainer_state(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
                "step_rng": self.ctx.rng.getstate(),
            },
            "data": self.sampler.state_dict(),
            **self.ctx.state_dict(),  # the method's own state (rubric: schedule, gate; reasoning: hooks)
            "method": str(self.cfg.method),
        }

    def save(self, state: dict[str, Any] | None = None) -> Path:
        """Checkpoints the current policy with ``state`` (default: the trainer state now)."""
        state = self.trainer_state() if state is None else state
        path = ckpt.save_checkpoint(self.run_dir, int(state["step"]), self.policy, state, critic=self.critic)
        ckpt.prune_checkpoints(self.run_dir, int(self.cfg.train.keep_checkpoints))
        log.info("checkpoint step %d -> %s", state["step"], path)
        return path

    def resume(self) -> int:
        """Load the latest complete checkpoint, if any, and truncate metrics.jsonl to it. Returns its step."""
        path = ckpt.latest_checkpoint(self.run_dir)
        if path is None:
            truncate_metrics(self.run_dir / "metrics.jsonl", 0)
            truncate_metrics(self.run_dir / "samples.jsonl", 0)
            return 0
        state = ckpt.load_checkpoint(path, self.policy, critic=self.critic)
        if state.get("method") not in (None, str(self.cfg.method)):
            raise RuntimeError(f"{path}: checkpoint of method {state['method']!r}, recipe says {self.cfg.method!r}")
        self.step = int(state["step"])
        self._pending_eval = bool(state.get("pending_eval", False))
        rng = state["rng"]
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])
        torch.set_rng_state(rng["torch"])
        if rng.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
        self.ctx.rng.setstate(rng["step_rng"])
        self.sampler.load_state_dict(state["data"])
        self.ctx.load_state_dict(state)
        dropped = truncate_metrics(self.run_dir / "metrics.jsonl", self.step)
        truncate_metrics(self.run_dir / "samples.jsonl", self.step)
        restarts = os.environ.get("SLURM_RESTART_COUNT")
        log.info("resumed from %s at step %d (dropped %d metrics lines after it)%s", path, self.step, dropped,
                 f"; SLURM_RESTART_COUNT={restarts}" if restarts is not None else "")
        return self.step

    # ------------------------------------------------------------------------------------------------------
    # Evaluation, metrics, sinks

    def _eval_due(self, step: int) -> bool:
        every = int(self.cfg.eval.every)
        return bool(self.eval_prompts) and (step == self.steps or (every > 0 and step % every == 0))

    def _checkpoint_due(self, step: int) -> bool:
        every = int(self.cfg.train.checkpoint_every)
        return step == self.steps or (every > 0 and step % every == 0)

    def run_eval(self, step: int) -> dict[str, Any]:
        """The method's evaluation (its training step's ``evaluate``) -> eval/step_XXXXXX.json, log, sinks."""
        result, fields = self._step_kind.evaluate(self.ctx, self.eval_prompts, step)
        self._write_eval(step, result)
        log.info("eval step %d: %s", step, ", ".join(f"{k} {_fmt(v)}" for k, v in fields.items()))
        return result

    def _write_eval(self, step: int, result: dict[str, Any]) -> None:
        out = self.run_dir / "eval" / f"step_{step:06d}.json"
        out.parent.mkdir(exist_ok=True)
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        os.replace(tmp, out)
        for sink in self._sinks:
            sink.log({f"eval/{k}": v for k, v in result.items() if isinstance(v, int | float)}, step)

    def _pretrain_critic(self) -> None:
        """``ppo.critic_pretrain_updates`` > 0 on a fresh run (step 0): fit the critic to the warm start's
        rollouts before step 1 (rise_nemo.steps.critic_pretrain); the result goes to critic_pretrain.json and
        the log. A resumed run's critic comes from its checkpoint, so nothing happens then."""
        if self.critic is None or self.step != 0 or int(self.cfg.ppo.critic_pretrain_updates) == 0:
            return
        from rise_nemo.steps.critic_pretrain import pretrain_critic

        out = pretrain_critic(self.ctx, self._train_prompts, int(self.cfg.run.seed))
        (self.run_dir / "critic_pretrain.json").write_text(json.dumps(out, indent=1))
        log.info("critic pre-training: %d updates on %d warm-start rollouts, held-out prefix AUC %s -> %s (%.0f s)",
                 int(self.cfg.ppo.critic_pretrain_updates), out["critic_pretrain/rollouts"],
                 out["critic_pretrain/auc_before"], out["critic_pretrain/auc_after"], out["critic_pretrain/seconds"])

    def _log_metrics(self, metrics: dict[str, Any], bar: Any) -> None:
        metrics.update(judge_counters(self.judge))
        with open(self.run_dir / "metrics.jsonl", "a") as fh:
            fh.write(json.dumps(metrics) + "\n")
            fh.flush()
        # samples.jsonl: what the step (RISE or reasoning) recorded of its rollouts.
        if self.ctx.last_samples:
            with open(self.run_dir / "samples.jsonl", "a") as fh:
                fh.write("".join(json.dumps(r) + "\n" for r in self.ctx.last_samples))
            self.ctx.last_samples = []
        for sink in self._sinks:
            sink.log({k: v for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)},
                     metrics["step"])
        if bar is not None:
            bar.update(1)
            bar.set_postfix(progress_postfix(metrics, self._progress_keys), refresh=False)
        else:
            log.debug("step %d %s", metrics["step"], {k: metrics.get(k) for k, _ in self._progress_keys})

    def _progress(self):
        if not self.cfg.train.progress:
            return contextlib.nullcontext()
        from tqdm.auto import tqdm

        return tqdm(total=self.steps, initial=self.step, desc=f"{self.cfg.method}", unit="step", dynamic_ncols=True)

    def _open_sinks(self) -> None:
        self._sinks = open_sinks(self.cfg, self.run_dir)

    def _close_sinks(self) -> None:
        for sink in self._sinks:
            sink.close()
        self._sinks = []

    def _attach_log_file(self) -> logging.Handler:
        handler = logging.FileHandler(self.run_dir / "train.log")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root = logging.getLogger("rise_nemo")
        root.addHandler(handler)
        if root.level == logging.NOTSET or root.level > logging.INFO:
            root.setLevel(logging.INFO)
        return handler

    def _write_config(self) -> None:
        write_config(self.run_dir, self.cfg, self.step)

    def _write_summary(self) -> None:
        evals = sorted((self.run_dir / "eval").glob("step_*.json")) if (self.run_dir / "eval").is_dir() else []
        last = json.loads(evals[-1].read_text()) if evals else None
        summary = {
            "method": str(self.cfg.method), "seed": int(self.cfg.run.seed), "steps": self.step,
            **self.ctx.summary(self.step),  # switch_reason, switch_step: a guidance switch that happened
            "final_eval": {k: v for k, v in (last or {}).items() if k not in ("criteria", "samples")},
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=1))


# ----------------------------------------------------------------------------------------------------------


def judge_counters(judge: Any) -> dict[str, float]:
    """The judge's cumulative counters (calls, cache hits, retries, timeouts, failures, ...) as
    ``judge/<name>`` floats for metrics.jsonl; {} for a judge without counters."""
    if isinstance(judge, CountingJudge):
        return dict(judge.metrics())
    if isinstance(judge, StatsJudge):
        from rise_nemo.judges.stats import stats_to_metrics

        return stats_to_metrics(judge.stats)
    return {}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def truncate_metrics(path: Path, last_step: int) -> int:
    """Drop metrics lines with step > last_step (atomically). Returns how many lines were dropped."""
    if not path.is_file():
        return 0
    keep, dropped = [], 0
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            step = int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            dropped += 1  # a half-written line from a hard kill
            continue
        if step <= last_step:
            keep.append(line)
        else:
            dropped += 1
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in keep))
    os.replace(tmp, path)
    return dropped


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    path = Path(path)
    if path.is_dir():
        path = path / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def progress_postfix(metrics: dict[str, Any], keys: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The progress bar's fields: ``keys`` (metric, short name) of the step; an undefined metric (None, e.g. the
    critic's explained variance on a step where every rollout earned the same reward) is left out."""
    return {short: _fmt(metrics[key]) for key, short in keys if metrics.get(key) is not None}


def _fmt(x: Any) -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        return f"{x:.3f}"
    return str(x)


class _TensorBoardSink:
    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, values: dict[str, float], step: int) -> None:
        for k, v in values.items():
            if v is not None:
                self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class _WandbSink:
    def __init__(self, cfg: Any, run_dir: Path):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(project=str(cfg.train.wandb_project), name=str(cfg.run.name), dir=str(run_dir),
                              resume="allow")

    def log(self, values: dict[str, float], step: int) -> None:
        self.run.log({k: v for k, v in values.items() if v is not None}, step=step)

    def close(self) -> None:
        self.run.finish()


def open_sinks(cfg: Any, run_dir: Path) -> list[Any]:
    """TensorBoard / W&B writers, only when enabled in ``train`` AND importable (else a logged note)."""
    sinks: list[Any] = []
    for enabled, name, factory in (
        (cfg.train.tensorboard, "tensorboard", lambda: _TensorBoardSink(run_dir)),
        (cfg.train.wandb, "wandb", lambda: _WandbSink(cfg, run_dir)),
    ):
        if not enabled:
            continue
        try:
            sinks.append(factory())
        except ImportError as exc:
            log.warning("train.%s is enabled but %s is not installed (%s); skipping", name, name, exc)
    return sinks
