"""A Ray cluster that declares GPUs it does not have, on 127.0.0.1: the head and one raylet per extra node.

Ray accepts declared resources without hardware (``num_gpus=N`` on a node with no GPU), so NeMo-RL's placement
groups, bundles and fractional GPU shares are scheduled exactly as on a GPU cluster; only CUDA is missing,
which the placement probes (placement_probe.py) never touch. Nodes are real raylets (``ray.cluster_utils``),
so a per-node placement group really lands on one node. Stopped by its own processes (never ``ray stop``).

``recipe_for_placement`` loads a shipped recipe as ``rise-nemo train`` would, with the model names pointed at
config-only model directories (``config_only_model``: the published shape in ``config.json`` and the test
tokenizer, no weights: the probes never load a model; the planner resolves the shape by the directory's name).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "tests"))

from private_ray import local_cluster  # noqa: E402

# What the workers inherit: NeMo-RL's init_ray hands os.environ to every actor (virtual_cluster.py:199-203).
CLUSTER_ENV = {
    "RAY_AUTH_MODE": "disabled", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0",
    "NRL_DISABLE_NUMA_BINDING": "1", "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1",
    "HF_HUB_OFFLINE": "1", "RAY_ENABLE_AUTO_CONNECT": "0",
    # deployment, not CUDA: NeMo-RL's Megatron Policy refuses to start without it (lm_policy.py:117-121)
    "TORCH_CUDA_ARCH_LIST": "9.0",
    # the probes touch no device: the CPU harness (which, among others, answers ray.get_gpu_ids() with [0]) stays off
    "RISE_NEMO_CPU_HARNESS": "0", "RISE_NEMO_CPU_DRIVER": "0",
}


@contextlib.contextmanager
def patched_environ(values: dict[str, str]) -> Iterator[None]:
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def virtual_gpu_cluster(nodes: int, gpus_per_node: int, cpus_per_node: int) -> Iterator[Any]:
    """``nodes`` raylets of ``gpus_per_node`` declared GPUs each (tests/private_ray.py: started again when a
    raylet misses Ray's start-up window); ``RAY_ADDRESS`` points at the head while the block runs (NeMo-RL's
    init_ray attaches to it). Yields the ``ray.cluster_utils.Cluster``."""
    import ray

    temp = Path("/tmp") / f"rv{uuid.uuid4().hex[:8]}"  # Ray's socket paths must stay short
    pythonpath = os.pathsep.join(p for p in (str(HERE), str(ROOT), os.environ.get("NEMO_RL_DIR", ""),
                                              os.environ.get("PYTHONPATH", "")) if p)
    with patched_environ({**CLUSTER_ENV, "PYTHONPATH": pythonpath}):
        os.environ.pop("RAY_ADDRESS", None)
        try:
            with local_cluster(nodes, num_gpus=gpus_per_node, num_cpus=cpus_per_node, temp_dir=temp) as cluster:
                os.environ["RAY_ADDRESS"] = cluster.address
                try:
                    yield cluster
                finally:
                    with contextlib.suppress(Exception):
                        ray.shutdown()
                    os.environ.pop("RAY_ADDRESS", None)
        finally:
            shutil.rmtree(temp, ignore_errors=True)


def shutdown_nemo_rl(*objects: Any) -> None:
    """NeMo-RL's objects shut down while their cluster still runs: a Policy / VllmGeneration / Value left to the
    garbage collector calls its workers from ``__del__`` after ``ray.shutdown()``, and Ray's auto-init then
    starts a private local cluster in this process."""
    import gc

    for obj in objects:
        with contextlib.suppress(Exception):
            obj.shutdown()
    gc.collect()


def bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """``fn()`` in a daemon thread, waited for at most ``seconds`` (a hang guard: an unplaceable worker group
    blocks NeMo-RL's driver for ever). Raises ``TimeoutError`` naming ``what`` and the pending actors."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"bounded {what}", daemon=True)
    start = time.monotonic()
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise TimeoutError(f"{what} did not return within {seconds:g} s; actors still waiting to be placed: "
                           f"{pending_actor_names()}")
    if "error" in box:
        raise box["error"]
    box["seconds"] = time.monotonic() - start
    return box["value"]


def pending_actor_names() -> list[str]:
    try:
        from ray._private import state

        return sorted(str(i.get("Name") or i.get("ActorClassName")) for i in state.actors().values()
                      if i.get("State") in ("DEPENDENCIES_UNREADY", "PENDING_CREATION"))
    except Exception as exc:  # noqa: BLE001 - only for the message
        return [f"(actor table unreadable: {exc})"]


# ----------------------------------------------------------------------------------------------------------
# Recipes on config-only models

HF_CONFIG = {  # planner shape -> the Hugging Face config.json fields NeMo-RL's driver reads (AutoConfig)
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "qwen2.5": ("Qwen2ForCausalLM", "qwen2"),
    "deepseek-coder": ("LlamaForCausalLM", "llama"),
    "llama-2": ("LlamaForCausalLM", "llama"),
}


def config_only_model(root: Path, hf_name: str, tokenizer_dir: Path) -> Path:
    """``root/<basename of hf_name>``: config.json with the model's published shape (rise_nemo.planner.models)
    and the test tokenizer; no weights."""
    from rise_nemo.planner.models import resolve_model

    shape = resolve_model(hf_name)
    out = root / hf_name.rsplit("/", 1)[-1]
    if (out / "config.json").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
    family = next(k for k in HF_CONFIG if shape.name.startswith(k))
    arch, model_type = HF_CONFIG[family]
    cfg = {
        "architectures": [arch], "model_type": model_type, "hidden_size": shape.hidden,
        "num_hidden_layers": shape.layers, "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads, "head_dim": shape.head_dim, "intermediate_size": shape.ffn,
        "vocab_size": shape.vocab, "tie_word_embeddings": shape.tied_embeddings, "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "torch_dtype": "bfloat16", "hidden_act": "silu",
    }
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def model_names(recipe: dict[str, Any]) -> list[str]:
    from rise_nemo.recipe_keys import get

    names = [get(recipe, "nemo.policy.model_name", None, str), get(recipe, "nemo.teacher.model_name", None, str)]
    return [n for n in names if n]


def recipe_for_placement(name: str, overrides: list[str], models_root: Path, tokenizer_dir: Path):
    """The shipped recipe ``name`` loaded with ``overrides`` and its models on config-only directories: the
    (DictConfig, plain dict) ``build_backend`` / ``setup_distillation`` take."""
    from rise_nemo.backends.nemo import plain_recipe
    from rise_nemo.config import load_config
    from rise_nemo.config.recipes import resolve_recipe

    path = resolve_recipe(name)
    first = plain_recipe(load_config(path, list(overrides)))
    swaps = []
    for key in ("policy", "teacher"):
        model = (first.get("nemo") or {}).get(key, {}).get("model_name")
        if model:
            local = config_only_model(models_root, model, tokenizer_dir)
            swaps += [f"nemo.{key}.model_name={local}", f"nemo.{key}.tokenizer.name={local}"]
    cfg = load_config(path, list(overrides) + swaps)
    return cfg, plain_recipe(cfg)
