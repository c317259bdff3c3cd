"""TRL parity benchmark: our embedded GRPO step (method rubric_rl) side by side with TRL's GRPOTrainer.

Setup: the embedded persistent task's warm-started tiny model (built and cached exactly as a local run
builds it, rise_nemo.loop.run.build_trainer), 8 prompts x 8 samples, 64 new tokens, temperature 1,
top-p 1, the same rule-judge reward (TRL gets a reward function wrapping the same judge and eq. 3 reward), no KL,
the same lr / AdamW settings / grad clip, 1 torch thread each. Equal work: step k of both sides trains on the
same 8 prompts, one optimizer step per batch of 64 rows, 4 micro-batches of 16 rows each (ours:
local.micro_batch_size=16; TRL: per_device_train_batch_size=16, gradient_accumulation_steps=4, one generation
batch of 64 per optimizer step).

Each side runs in its own subprocess (so peak RSS is separable), driven step by step over a pipe and interleaved
(our step 1, TRL step 1, our step 2, ...) so both see the same machine load. A step's time runs from the
command to the end of its optimizer step. Peak RSS is each process's VmHWM over the timed steps only: the
high-water mark is reset (``/proc/self/clear_refs`` = 5) after set-up, so model loading and the warm start
do not count; where the kernel refuses the reset the line says so and ru_maxrss (incl. set-up) is used.

Per-stage split: ours from the step's ``time/*`` metrics (natural = generation + judging + advantages,
train = loss/backward/optimizer, plus a no-grad log-prob forward where the backend needs one: not on
the local backend, whose training forward gives pi_old); TRL from timers around
``_generate_and_score_completions`` (generation + reward + advantages) with the reward function timed inside;
the rest of TRL's step is loss + backward + optimizer.

Ends with exactly one line
    RESULT step_ratio=<median ours/TRL step time over the timed pairs> rss_ratio=<ours/TRL peak RSS> pairs=<n>

Usage: python bench/trl_parity.py [--pairs 12] [--quick] [--out DIR] [key=value recipe overrides for ours]
Needs the bench extra: pip install -e '.[local,bench]'.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._cli import parse_with_overrides  # noqa: E402

PROMPTS, GROUP, NEW_TOKENS, MICRO = 8, 8, 64, 16
MARK = "@@trl_parity "  # a worker's messages to the driver (libraries print to stdout too)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pairs", type=int, default=12, help="timed interleaved (ours, TRL) step pairs, after one "
                   "untimed warm-up pair (one-off costs: allocator warm-up, TRL's lazy set-up)")
    p.add_argument("--quick", action="store_true", help="1 timed pair (a smoke run of the whole path)")
    p.add_argument("--out", default="/tmp/rise_bench_trl_parity")
    p.add_argument("--worker", choices=["ours", "trl"], help=argparse.SUPPRESS)
    p.add_argument("overrides", nargs="*", help="recipe overrides for our side (key=value)")
    args = parse_with_overrides(p, argv)
    if args.quick:
        args.pairs = 1
    if args.pairs < 1:
        p.error("--pairs must be >= 1")
    return args


# ----------------------------------------------------------------------------------------------------------
# Shared by both workers


def config(args, run_dir: Path):
    from rise_nemo.config import load_config

    return load_config(REPO / "recipes" / "rubric_rl_tiny_cpu.yaml", [
        f"run.dir={run_dir}", "train.checkpoint_every=0", "train.progress=false", "eval.at_start=false",
        "eval.every=0", "local.num_threads=1", f"sampling.prompts_per_step={PROMPTS}", f"sampling.group_size={GROUP}",
        f"sampling.max_new_tokens={NEW_TOKENS}", "sampling.temperature=1.0", "sampling.top_p=1.0", "policy_loss.kl_coef=0.0",
        f"++local.micro_batch_size={MICRO}", f"++local.generation_batch_size={PROMPTS * GROUP}",
        *args.overrides,
    ])


def step_batches(prompts: list, pairs: int) -> list[list]:
    """The prompts of step k on both sides: consecutive slices of the training set, in order."""
    return [[prompts[(k * PROMPTS + i) % len(prompts)] for i in range(PROMPTS)] for k in range(pairs)]


def reset_peak_rss() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb(reset_ok: bool) -> float:
    if reset_ok:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def send(obj: dict) -> None:
    sys.__stdout__.write(MARK + json.dumps(obj) + "\n")
    sys.__stdout__.flush()


def wait_command() -> str:
    line = sys.stdin.readline()
    return line.strip() or "stop"


# ----------------------------------------------------------------------------------------------------------
# Workers


def worker_ours(args) -> None:
    import shutil

    import torch

    from rise_nemo.loop.run import build_trainer
    from rise_nemo.loop.trainer import seed_everything
    from rise_nemo.steps.rubric import train_step

    torch.set_num_threads(1)
    run_dir = Path(args.out) / "ours"
    shutil.rmtree(run_dir, ignore_errors=True)
    tr = build_trainer(config(args, run_dir))
    model_dir = tr.policy.save_pretrained(Path(args.out) / "warm_model")  # TRL starts from these weights
    batches = step_batches(tr.sampler.prompts, args.pairs + 1)
    seed_everything(0)
    reset_ok = reset_peak_rss()
    send({"ready": True, "model_dir": str(model_dir), "prompt_ids": [[p.prompt_id for p in b] for b in batches],
          "optim": {k: getattr(tr.policy.engine.cfg, k) for k in ("lr", "betas", "eps", "weight_decay", "grad_clip")},
          "clip": [float(tr.cfg.policy_loss.clip_low), float(tr.cfg.policy_loss.clip_high)]})
    for k, batch in enumerate(batches, start=1):
        if wait_command() != "step":
            break
        t0 = time.perf_counter()
        m = train_step(tr.ctx, batch, k)
        dt = time.perf_counter() - t0
        send({"step": k, "time_s": dt, "split": {"generate+judge": m["time/natural_s"], "train": m["time/train_s"]}})
    wait_command()  # "finish": after the other side's last step too, so no tear-down overlaps a timed step
    send({"peak_rss_mb": peak_rss_mb(reset_ok), "rss_reset": reset_ok})
    if tr.lock is not None:
        tr.lock.release()


def worker_trl(args, model_dir: str, prompt_ids: list[list[str]], optim: dict, clip: list[float]) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rise_nemo.core.rewards import rubric_reward
    from rise_nemo.interfaces import JudgeRequest
    from rise_nemo.judges.checked import build_checked_judge
    from rise_nemo.loop.data import load_prompts_checked

    torch.set_num_threads(1)
    cfg = config(args, Path(args.out) / "trl_cfg")
    train_prompts, _ = load_prompts_checked(cfg)
    by_id = {p.prompt_id: p for p in train_prompts}
    judge = build_checked_judge(cfg.judge)
    clip_min = cfg.reward.clip_min
    timers = {"reward": 0.0, "generate+score": 0.0}
    seen: set[str] = set()  # the prompts TRL trained on this step (checked against ours by the driver)

    def rubric_reward_func(prompts, completions, prompt_id, **_kw) -> list[float]:
        t0 = time.perf_counter()
        reqs = []
        seen.update(prompt_id)
        for pid, comp in zip(prompt_id, completions):
            p = by_id[pid]
            text = comp[-1]["content"] if isinstance(comp, list) else comp
            reqs.append(JudgeRequest(conversation=list(p.messages), response=text.strip(), rubric=p.rubric,
                                     prompt_id=pid))
        out = []
        for req, verdict in zip(reqs, judge.judge(reqs)):
            if any(v is None for v in verdict):
                out.append(None)  # TRL treats None as "no reward" (as ours excludes an unknown verdict)
            else:
                z = torch.tensor([float(v) for v in verdict])
                out.append(float(rubric_reward(z, req.rubric.weights, clip_min=clip_min)))
        timers["reward"] += time.perf_counter() - t0
        return out

    rows = [by_id[pid] for batch in prompt_ids for pid in batch]
    ds = Dataset.from_list([{"prompt": [dict(m) for m in p.messages], "prompt_id": p.prompt_id} for p in rows])
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    gc = GRPOConfig(
        output_dir=str(Path(args.out) / "trl"), per_device_train_batch_size=MICRO,
        gradient_accumulation_steps=PROMPTS * GROUP // MICRO, num_generations=GROUP,
        max_completion_length=NEW_TOKENS, temperature=1.0, top_p=1.0, top_k=0, learning_rate=optim["lr"],
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=optim["weight_decay"], adam_beta1=optim["betas"][0],
        adam_beta2=optim["betas"][1], adam_epsilon=optim["eps"], optim="adamw_torch", max_grad_norm=optim["grad_clip"], beta=0.0, epsilon=clip[0],
        epsilon_high=clip[1], num_iterations=1, shuffle_dataset=False, max_steps=len(prompt_ids), logging_steps=1,
        save_strategy="no", report_to=[], use_cpu=True, bf16=False, disable_tqdm=True, seed=0,
        dataloader_num_workers=0, gradient_checkpointing=False,  # ours recomputes nothing either
    )

    class Pace(TrainerCallback):
        """Waits for the parent's command before each optimizer step and reports the step's time after it."""

        def __init__(self):
            self.t0 = 0.0
            self.k = 0
            self.reset_ok = False

        def on_train_begin(self, *a, **kw):
            self.reset_ok = reset_peak_rss()
            send({"ready": True})
            if wait_command() != "step":
                raise SystemExit(0)
            self.t0 = time.perf_counter()
            for key in timers:
                timers[key] = 0.0

        def on_step_end(self, *a, **kw):
            dt = time.perf_counter() - self.t0
            self.k += 1
            gen = timers["generate+score"]
            send({"step": self.k, "time_s": dt, "split": {"generate+judge": gen, "train": dt - gen,
                                                          "reward (inside generate+judge)": timers["reward"]},
                  "prompt_ids": sorted(seen)})
            seen.clear()
            if wait_command() != "step" and self.k < len(prompt_ids):
                raise SystemExit(0)
            for key in timers:
                timers[key] = 0.0
            self.t0 = time.perf_counter()

    pace = Pace()
    trainer = GRPOTrainer(model=model, processing_class=tok, reward_funcs=rubric_reward_func, args=gc,
                          train_dataset=ds, callbacks=[pace])
    inner = trainer._generate_and_score_completions

    def timed(*a, **kw):
        t0 = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            timers["generate+score"] += time.perf_counter() - t0

    trainer._generate_and_score_completions = timed
    trainer.train()
    send({"peak_rss_mb": peak_rss_mb(pace.reset_ok), "rss_reset": pace.reset_ok})


# ----------------------------------------------------------------------------------------------------------
# Driver


class Worker:
    def __init__(self, args, side: str, extra: list[str]):
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
        cmd = [sys.executable, __file__, "--worker", side, "--pairs", str(args.pairs), "--out", args.out,
               *extra, *args.overrides]
        self.side = side
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def read(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise SystemExit(f"trl_parity: the {self.side} worker exited (rc {self.proc.wait()}); see its stderr")
            line = line.strip()
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])

    def step(self) -> dict:
        self.proc.stdin.write("step\n")
        self.proc.stdin.flush()
        return self.read()

    def finish(self) -> dict:
        self.proc.stdin.write("finish\n")
        self.proc.stdin.flush()
        out = self.read()
        self.proc.stdin.close()
        self.proc.wait(timeout=600)
        return out


def split_text(split: dict, total: float) -> str:
    return " ".join(f"{k} {v:.2f}s ({100 * v / total:.0f}%)" for k, v in split.items())


def main() -> int:
    args = parse_args()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if args.worker == "ours":
        worker_ours(args)
        return 0
    if args.worker == "trl":
        spec = json.loads(sys.stdin.readline())
        worker_trl(args, spec["model_dir"], spec["prompt_ids"], spec["optim"], spec["clip"])
        return 0
    try:
        import trl
    except ImportError:
        raise SystemExit("trl_parity: TRL is not installed; pip install -e '.[bench]'") from None
    print(f"TRL {trl.__version__}; {args.pairs} interleaved pairs, {PROMPTS} prompts x {GROUP} samples, "
          f"{NEW_TOKENS} new tokens, 1 thread each; load average {os.getloadavg()[0]:.2f}", flush=True)
    ours = Worker(args, "ours", [])
    spec = ours.read()  # the warm start is built (or loaded from its cache) and saved for TRL
    theirs = Worker(args, "trl", [])
    theirs.proc.stdin.write(json.dumps(spec) + "\n")
    theirs.proc.stdin.flush()
    theirs.read()
    rows = []
    for k in range(0, args.pairs + 1):  # pair 0: the warm-up
        a = ours.step()
        b = theirs.step()
        rows.append((a, b))
        if b["prompt_ids"] != sorted(spec["prompt_ids"][k]):
            raise SystemExit(f"trl_parity: pair {k}: TRL trained on {b['prompt_ids']}, ours on "
                             f"{sorted(spec['prompt_ids'][k])} (not equal work)")
        print(f"pair {k}: ours {a['time_s']:.2f}s [{split_text(a['split'], a['time_s'])}]  "
              f"TRL {b['time_s']:.2f}s [{split_text(b['split'], b['time_s'])}]  "
              f"ratio {a['time_s'] / b['time_s']:.3f}  load {os.getloadavg()[0]:.2f}", flush=True)
    ra, rb = ours.finish(), theirs.finish()
    timed = rows[1:]  # pair 0 pays one-off costs (allocator warm-up, TRL's lazy set-up)
    ratio = statistics.median(a["time_s"] / b["time_s"] for a, b in timed)
    med = {side: statistics.median(r[i]["time_s"] for r in timed) for i, side in enumerate(("ours", "TRL"))}
    for i, side in enumerate(("ours", "TRL")):
        keys = timed[0][i]["split"]
        split = {key: statistics.median(r[i]["split"][key] for r in timed) for key in keys}
        print(f"{side}: median step {med[side]:.2f}s; median split {split_text(split, med[side])}")
    note = "" if ra["rss_reset"] and rb["rss_reset"] else " (incl. set-up: the peak could not be reset)"
    print(f"peak RSS over the timed steps: ours {ra['peak_rss_mb']:.0f} MiB, TRL {rb['peak_rss_mb']:.0f} MiB{note}")
    print(f"RESULT step_ratio={ratio:.3f} rss_ratio={ra['peak_rss_mb'] / rb['peak_rss_mb']:.3f} pairs={len(timed)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
