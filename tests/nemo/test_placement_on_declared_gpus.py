"""The cluster as a GPU cluster sees it: NeMo-RL's real setup path places every worker group on declared GPUs.

On a CPU every NeMo-RL worker asks for 0 GPUs and any number of worker groups "fit", so what decides whether a
run starts on H200 nodes never ran. Here a Ray cluster declares GPUs (virtual_gpus.py: ``num_gpus=N`` per
raylet, extra raylets on 127.0.0.1 for more nodes) and the exact path ``rise-nemo train`` / ``rise-nemo distill``
take builds its workers on it: ``build_backend`` (``grpo.setup``: ``RayVirtualCluster``, placement groups,
``VllmGeneration``, ``Policy``), ``build_critic`` (NeMo-RL's ``Value``) and ``setup_distillation``
(``distillation.setup`` with its teacher). Only the worker classes are replaced, because they would touch CUDA:
by probes that record their node, bundle, GPU ids and granted resources (placement_probe.py).

- Executed with real Ray actors, one recipe per shape, shrunk to 1-2 declared GPUs per node (the rules below do
  not depend on the count): GRPO + vLLM (grpo_math_qwen3_4b), PPO with its critic (ppo_math_7b), on-policy
  distillation with the 32B teacher on two training nodes whose judge node is outside Ray (opd_14b_teacher32b).
  Each asserts, within a bounded time, that every group is placed, that every GPU carries one worker of each
  colocated group with ``1 / groups`` of it (the same physical GPU id for all of them), and that no GPU is
  oversubscribed.
- Every other cluster recipe at its documented node count and 8 GPUs per node: the same setup path with real
  placement groups, worker creation recorded instead of spawned (placement_probe "recorded"), Ray's bundle rule
  applied to what NeMo-RL asked for. ``test_recorded_claims_equal_what_ray_grants`` pins the recorded claims to
  the executed ones.

Before the critic got its own colocated slot (rise_nemo.backends.nemo.placement), ``build_critic`` put the value
model on grpo.setup's two-group cluster: the executed PPO test then timed out with the value workers pending,
and the recorded PPO/RRL recipes claimed 1.5 GPUs per bundle.
"""

from __future__ import annotations

import sys
from collections import Counter, defaultdict
from pathlib import Path

import pytest
from nemo_venv import import_nemo_rl

pytestmark = pytest.mark.nemo
import_nemo_rl()

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT / "tests" / "judges"))

import placement_probe  # noqa: E402
from cpu_nemo import make_prompts  # noqa: E402
from virtual_gpus import bounded, recipe_for_placement, shutdown_nemo_rl, virtual_gpu_cluster  # noqa: E402

SETUP_TIMEOUT_S = 600  # hang guard only: an unplaceable group never returns
RULE_JUDGE = "judge={type: rule}"
VLLM, POLICY, VALUE, TEACHER = "vllm", "policy", "value", "teacher"


def role(record: dict) -> str:
    real = record["real"]
    if "vllm" in real:
        return VLLM
    if ".value." in real:
        return VALUE
    name = str(record.get("name") or "")
    return TEACHER if name.startswith("teacher") else POLICY


@pytest.fixture(scope="module", autouse=True)
def no_ray_auto_init():
    """A NeMo-RL object a failed test leaves to the garbage collector calls its workers from ``__del__``; with
    auto-init off that call fails instead of starting a private local Ray cluster in this process."""
    import gc

    from virtual_gpus import patched_environ

    with patched_environ({"RAY_ENABLE_AUTO_CONNECT": "0"}):
        yield
        gc.collect()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    from tiny_qwen3 import build

    return build(tmp_path_factory.mktemp("tok") / "tiny", vocab_size=512)


@pytest.fixture(scope="module")
def models_root(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


def gather(*groups) -> list[dict]:
    import ray

    out = []
    for group in groups:
        out += ray.get([w.placement.remote() for w in group.workers])
    return out


def assert_colocated(records: list[dict], groups: tuple[str, ...], gpus: int) -> None:
    """Every one of the ``gpus`` GPUs carries one worker of each group, each with 1/len(groups) of that GPU (the
    same physical GPU id for all of them), and no GPU carries more than a whole GPU."""
    by_gpu: dict[tuple[str, int], list[dict]] = defaultdict(list)
    for r in records:
        assert len(r["gpu_ids"]) == 1, r  # a fractional share is one GPU
        by_gpu[(r["node_id"], r["gpu_ids"][0])].append(r)
    assert len(by_gpu) == gpus, {k: [role(r) for r in v] for k, v in by_gpu.items()}
    for where, rs in by_gpu.items():
        assert sorted(role(r) for r in rs) == sorted(groups), (where, [role(r) for r in rs])
        shares = [r["resources"]["GPU"] for r in rs]
        # Ray keeps 4 decimals of a fractional share (1/3 -> 0.3333)
        assert shares == pytest.approx([1 / len(groups)] * len(groups), abs=1e-4), (where, shares)
        assert sum(shares) <= 1 + 1e-9, (where, shares)
        assert len({(r["placement_group"], r["bundle"]) for r in rs}) == 1, "one bundle per GPU"


def run_with_probes(fn, recorded: bool = False):
    undo = placement_probe.probe_worker_classes(recorded=recorded)
    try:
        return fn()
    finally:
        undo()


# -- executed: real actors on declared GPUs --------------------------------------------------------------------


def test_grpo_vllm_executed_placement(tokenizer_dir, models_root):
    """grpo_math_qwen3_4b on 1 node x 2 declared GPUs: grpo.setup's colocated cluster holds vLLM and the Megatron
    policy, half a GPU each on every GPU."""
    from rise_nemo.backends.nemo import build_backend

    cfg, _ = recipe_for_placement("grpo_math_qwen3_4b", ["nemo.cluster.gpus_per_node=2", RULE_JUDGE],
                                  models_root, tokenizer_dir)
    with virtual_gpu_cluster(nodes=1, gpus_per_node=2, cpus_per_node=8):
        policy, generator = run_with_probes(lambda: bounded(
            lambda: build_backend(cfg, train_prompts=make_prompts(4)), SETUP_TIMEOUT_S, "build_backend"))
        session = policy.session
        records = gather(session.generation.worker_group, session.policy.worker_group)
        assert session.train_cluster.max_colocated_worker_groups == 2
        shutdown_nemo_rl(session.generation, session.policy)
    assert Counter(role(r) for r in records) == {VLLM: 2, POLICY: 2}
    assert_colocated(records, (VLLM, POLICY), gpus=2)
    assert all(r["resources"].get("CPU") == 1.0 for r in records), records


def test_ppo_critic_executed_placement(tokenizer_dir, models_root):
    """ppo_math_7b on 1 node x 2 declared GPUs: vLLM, the Megatron policy AND the Megatron value model share every
    GPU a third each, as NeMo-RL's ppo.setup lays them out (ppo.py:407-415). Before the fix the value workers
    stayed pending for ever and build_critic never returned."""
    from rise_nemo.backends.nemo import build_backend, build_critic

    cfg, _ = recipe_for_placement("ppo_math_7b", ["nemo.cluster.gpus_per_node=2"], models_root, tokenizer_dir)
    with virtual_gpu_cluster(nodes=1, gpus_per_node=2, cpus_per_node=10):
        def build():
            policy, generator = build_backend(cfg, train_prompts=make_prompts(4))
            return policy, build_critic(cfg, policy)

        policy, critic = run_with_probes(lambda: bounded(build, SETUP_TIMEOUT_S, "build_backend + build_critic"))
        session = policy.session
        records = gather(session.generation.worker_group, session.policy.worker_group, critic.value.worker_group)
        assert session.train_cluster.max_colocated_worker_groups == 3 and session.colocated_groups == 3
        shutdown_nemo_rl(session.generation, session.policy, critic.value)
    assert Counter(role(r) for r in records) == {VLLM: 2, POLICY: 2, VALUE: 2}
    assert_colocated(records, (VLLM, POLICY, VALUE), gpus=2)


def test_opd_two_nodes_with_teacher_executed_placement(tokenizer_dir, models_root, tmp_path):
    """opd_14b_teacher32b's shape on its 2 training nodes, 1 declared GPU each (its judge node is not a Ray node,
    as slurm/launch.sh lays it out): distillation.setup's one cluster holds the student (PP 2 across the two
    nodes), vLLM and the 32B teacher on both GPUs, a third of each. The student is Qwen3-0.6B here so that the
    planner fits the 32B teacher beside it on one GPU per node (placement does not depend on the model)."""
    import ray

    from rise_nemo.backends.nemo.distill import setup_distillation

    overrides = ["nemo.cluster.gpus_per_node=1", RULE_JUDGE, f"run.dir={tmp_path / 'run'}",
                 "nemo.plan.judge.tensor_parallel_size=1",
                 "nemo.policy.model_name=Qwen/Qwen3-0.6B", "nemo.policy.tokenizer.name=Qwen/Qwen3-0.6B",
                 "nemo.policy.megatron_cfg.tensor_model_parallel_size=1",
                 "nemo.policy.megatron_cfg.pipeline_model_parallel_size=2",
                 "nemo.policy.megatron_cfg.sequence_parallel=false",
                 "nemo.policy.generation.vllm_cfg.tensor_parallel_size=1",
                 "nemo.teacher.megatron_cfg.tensor_model_parallel_size=1",
                 "nemo.teacher.megatron_cfg.sequence_parallel=false"]
    cfg, recipe = recipe_for_placement("opd_14b_teacher32b", overrides, models_root, tokenizer_dir)
    assert recipe["nemo"]["teacher"]["model_name"].endswith("Qwen3-32B")
    with virtual_gpu_cluster(nodes=2, gpus_per_node=1, cpus_per_node=8) as cluster:
        out = run_with_probes(lambda: bounded(
            lambda: setup_distillation(cfg, make_prompts(4), make_prompts(2, 4)), SETUP_TIMEOUT_S,
            "setup_distillation"))
        records = gather(out["generation"].worker_group, out["student"].worker_group, out["teacher"].worker_group)
        nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
        assert len(cluster.list_all_nodes()) == 2
        shutdown_nemo_rl(out["generation"], out["student"], out["teacher"])
    assert Counter(role(r) for r in records) == {VLLM: 2, POLICY: 2, TEACHER: 2}, [r["name"] for r in records]
    assert {r["node_id"] for r in records} == nodes  # both training nodes carry workers
    assert_colocated(records, (VLLM, POLICY, TEACHER), gpus=2)


# -- every cluster recipe at its documented size: real placement groups, worker creation recorded --------------

GPUS_PER_NODE = 8  # an H200 node, whatever part of it the recipe's training cluster takes


def cluster_recipes() -> list[str]:
    """Every shipped recipe with ``backend: nemo``, one-training-node recipes first (they share a Ray cluster)."""
    import yaml

    from rise_nemo.config import load_config

    out = []
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        if "pipeline" in (yaml.safe_load(path.read_text()) or {}):
            continue  # a pipeline of recipes (rise_nemo.loop.pipeline), not one run
        cfg = load_config(path, [])
        if cfg.backend == "nemo":
            out.append((int(cfg.nemo.cluster.num_nodes), path.stem))
    return [name for _, name in sorted(out)]


@pytest.fixture(scope="module")
def documented_cluster():
    """``cluster(nodes)``: a virtual Ray cluster of ``nodes`` raylets x 8 GPUs, kept for the next recipe of the same
    node count (the driver disconnects between recipes: each recipe is a fresh Ray job)."""
    import contextlib

    current: dict[str, object] = {}
    stack = contextlib.ExitStack()

    def cluster(nodes: int):
        if current.get("nodes") != nodes:
            stack.close()
            current["cluster"] = stack.enter_context(
                virtual_gpu_cluster(nodes=nodes, gpus_per_node=GPUS_PER_NODE, cpus_per_node=4 * GPUS_PER_NODE))
            current["nodes"] = nodes
        return current["cluster"]

    with stack:
        yield cluster


def build_recorded(cfg, recipe: dict) -> dict:
    """The setup path of ``recipe`` with worker creation recorded: {"clusters": [...], "groups": k,
    "master": ...}."""
    from rise_nemo.backends.nemo import build_backend, build_critic
    from rise_nemo.backends.nemo.config import NEMO_DISTILLATION, algorithm
    from rise_nemo.backends.nemo.distill import setup_distillation
    from rise_nemo.backends.nemo.placement import has_critic

    if algorithm(recipe) == NEMO_DISTILLATION:
        out = setup_distillation(cfg, make_prompts(8), make_prompts(2, 8))
        return {"clusters": [out["student"].worker_group.cluster], "master": out["master"],
                "groups": (VLLM, POLICY, TEACHER), "objects": (out["generation"], out["student"], out["teacher"])}
    policy, _ = build_backend(cfg, train_prompts=make_prompts(8))
    groups, objects = (VLLM, POLICY), [policy.session.generation, policy.session.policy]
    if has_critic(recipe):
        objects.append(build_critic(cfg, policy).value)
        groups += (VALUE,)
    return {"clusters": [policy.session.train_cluster], "master": None, "groups": groups, "objects": objects}


@pytest.mark.parametrize("name", cluster_recipes())
def test_recipe_placement_at_documented_size(name, documented_cluster, tokenizer_dir, models_root, tmp_path):
    """The recipe's own layout (its nemo.cluster nodes, 8 GPUs each): every worker NeMo-RL asks Ray for fits its
    bundle, and every GPU bundle of the training cluster carries one worker of each colocated group with
    1/groups of the GPU (all of it used, none oversubscribed). For distillation, NeMo-RL's LR schedule is sized
    for train.steps (its train_iters, distillation.py:571-576, from the derived epoch limit)."""
    from rise_nemo.recipe_keys import get

    cfg, recipe = recipe_for_placement(name, [RULE_JUDGE, f"run.dir={tmp_path / 'run'}"], models_root,
                                       tokenizer_dir)
    nodes = get(recipe, "nemo.cluster.num_nodes", typ=int)
    import ray

    placement_probe.RECORDS.clear()
    documented_cluster(nodes)
    try:
        built = run_with_probes(lambda: bounded(lambda: build_recorded(cfg, recipe), SETUP_TIMEOUT_S, name),
                                recorded=True)
        capacity = placement_probe.capacity_of(built["clusters"])
        shutdown_nemo_rl(*built["objects"])
    finally:
        ray.shutdown()  # the next recipe is a new Ray job on the same cluster
    records = list(placement_probe.RECORDS)
    assert records, "no worker was created"
    assert placement_probe.overfull(records, capacity) == []
    usage = placement_probe.bundle_usage(records)
    groups = built["groups"]
    assert len(capacity) == get(recipe, "nemo.cluster.gpus_per_node", typ=int) * nodes
    for bundle, cap in capacity.items():
        assert cap["GPU"] == 1.0 and cap["CPU"] == len(groups), (bundle, cap)  # NeMo-RL's bundle for k groups
        assert usage.get(bundle) == {"GPU": pytest.approx(1.0), "CPU": pytest.approx(len(groups))}, (bundle, usage)
    assert Counter(role(r) for r in records if r["resources"]["GPU"] > 0 or r.get("fraction_of_gpus")) \
        .keys() == set(groups)
    if built["master"] is not None and get(recipe, "nemo.policy.megatron_cfg.enabled", False):
        assert built["master"].policy["megatron_cfg"]["train_iters"] == get(recipe, "train.steps", typ=int)


def test_port_table_holds_nemo_rl_constants():
    """rise_nemo/ports.py's NeMo-RL rows are NeMo-RL's own (virtual_cluster.py:84-100)."""
    from nemo_rl.distributed import virtual_cluster as vc

    from rise_nemo import ports

    rows = {u.name: u for u in ports.table()}
    assert (rows["vLLM / SGLang HTTP servers"].low, rows["vLLM / SGLang HTTP servers"].high) == \
        (vc.DEFAULT_GENERATION_PORT_RANGE_LOW, vc.DEFAULT_GENERATION_PORT_RANGE_HIGH)
    assert (rows["NeMo Gym HTTP servers"].low, rows["NeMo Gym HTTP servers"].high) == \
        (vc.DEFAULT_GYM_PORT_RANGE_LOW, vc.DEFAULT_GYM_PORT_RANGE_HIGH)
    master = rows["NeMo-RL master address / TCPStore"]
    assert (master.low, master.high + 1) == (vc.DEFAULT_MASTER_PORT_RANGE_LOW, vc.DEFAULT_MASTER_PORT_RANGE_HIGH)
    engines = ports.vllm_rendezvous(3)
    assert (engines.low, engines.high) == (vc.DEFAULT_VLLM_PORT_RANGE_LOW,
                                           vc.DEFAULT_VLLM_PORT_RANGE_LOW + 3 * vc.DEFAULT_VLLM_PORTS_PER_ENGINE - 1)


def test_a_layout_ray_cannot_hold_ends_the_run_with_one_line(tokenizer_dir, models_root, tmp_path):
    """`rise-nemo train` of a recipe whose training node needs 2 GPUs on a Ray node that has 1: NeMo-RL's
    RayVirtualCluster gives up after its retries (ResourceInsufficientError; NRL_VIRTUAL_CLUSTER_MAX_RETRIES, its
    own knob, keeps that short here) and the run ends with exit 1 and one line naming the recipe's layout."""
    import os
    import subprocess

    import yaml
    from virtual_gpus import config_only_model

    model = config_only_model(models_root, "Qwen/Qwen3-4B", tokenizer_dir)
    rows = str(ROOT / "tests" / "data" / "fixtures" / "math_sample.jsonl")
    recipe = tmp_path / "two_gpus.yaml"
    recipe.write_text(yaml.safe_dump({
        "defaults": [str(ROOT / "recipes" / "grpo_math_qwen3_4b.yaml")],
        "run": {"dir": str(tmp_path / "run")}, "data": {"train_path": rows, "eval_path": rows},
        "train": {"progress": False, "tensorboard": False},
        "nemo": {"cluster": {"gpus_per_node": 2}, "policy": {"model_name": str(model), "tokenizer": {"name": str(model)}}},
    }))
    with virtual_gpu_cluster(nodes=1, gpus_per_node=1, cpus_per_node=8):
        env = {**os.environ, "NRL_VIRTUAL_CLUSTER_MAX_RETRIES": "1"}
        done = subprocess.run([sys.executable, "-m", "rise_nemo.cli", "train", "--config", str(recipe)],
                              env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, (done.returncode, done.stderr[-3000:])
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("rise-nemo train:")]
    assert len(lines) == 1, done.stderr[-3000:]
    assert lines[0].startswith("rise-nemo train: NemoPlacementError: cannot place the worker groups of "
                               "grpo_math_qwen3_4b: 1 training node(s) x 2 GPUs"), lines[0]
    assert "Maximum number of retries reached (1)" in lines[0], lines[0]  # NeMo-RL's own reason, kept
