"""Every test-harness patch that lets NeMo-RL v0.7.0's REAL DTensor v1 policy worker run on a CPU (one place).

NeMo-RL's DTensorPolicyWorker assumes one CUDA GPU per Ray actor. On a CPU-only CI machine the patches below
turn those assumptions into their CPU equivalents; NO NeMo-RL file is edited and no NeMo-RL code is copied.
Two halves:

- ``patch_driver()`` runs in the test process (the Ray driver): which interpreter the worker actor gets.
- ``patch_worker()`` runs in every Ray worker process, from the ``sitecustomize.py`` that
  ``write_worker_sitecustomize()`` generates (the workers inherit the driver's environment: NeMo-RL copies
  ``os.environ`` into each worker's runtime_env, nemo_rl/distributed/worker_groups.py:444-447, so a
  PYTHONPATH entry set by the test reaches them). It does nothing unless RISE_NEMO_CPU_HARNESS=1.

Why none of them can hide a defect of ours: rise_nemo's nemo backend (rise_nemo/backends/nemo) never names a
device, never creates a process group or device mesh, never calls torch.cuda and never picks an actor's
interpreter; all of that is NeMo-RL's worker code. The patches only change WHERE NeMo-RL's tensors live
(cuda -> cpu) and which collective backend it uses (nccl -> gloo, same semantics for one rank); our batch
building and loss adapter still go through the worker's real sharding, micro-batching, loss call,
backward, grad clipping, optimizer step and DCP checkpointing. What the device remap COULD hide: a tensor of
ours that NeMo-RL expects on the GPU but we leave on the CPU (the remap makes both the same device); our
batches are plain CPU tensors that NeMo-RL itself moves (``data.to("cuda")``), so this does not arise today.
Each patch names the NeMo-RL file:line (v0.7.0) it works around.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ENV_FLAG = "RISE_NEMO_CPU_HARNESS"
HERE = Path(__file__).resolve().parent

DTENSOR_V1 = "nemo_rl.models.policy.workers.dtensor_policy_worker.DTensorPolicyWorker"


# ----------------------------------------------------------------------------------------------------------
# Driver side


def patch_driver() -> str:
    """The DTensor v1 worker runs in this test interpreter (the NeMo-RL CPU venv).

    ray_actor_environment_registry.py:34 maps it to ``uv run --locked --extra fsdp`` (worker_groups.py:453-460
    then builds a fresh venv and downloads flash-attn, impossible offline); NEMO_RL_PY_EXECUTABLES_SYSTEM
    (:19-27) covers only vLLM/SGLang/Megatron. The interpreter choice is deployment, not our code.
    Returns the previous entry (``unpatch_driver`` restores it).
    """
    from nemo_rl.distributed import ray_actor_environment_registry as registry

    previous = registry.ACTOR_ENVIRONMENT_REGISTRY[DTENSOR_V1]
    registry.ACTOR_ENVIRONMENT_REGISTRY[DTENSOR_V1] = sys.executable
    return previous


def unpatch_driver(previous: str) -> None:
    from nemo_rl.distributed import ray_actor_environment_registry as registry

    registry.ACTOR_ENVIRONMENT_REGISTRY[DTENSOR_V1] = previous


def write_worker_sitecustomize(directory: Path) -> Path:
    """A ``sitecustomize.py`` for the Ray workers: the venv's typing fix (nemo_venv.SITECUSTOMIZE, which a
    sitecustomize earlier on PYTHONPATH would otherwise shadow) and then ``patch_worker()``."""
    import nemo_venv

    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "sitecustomize.py"
    target.write_text(
        nemo_venv.SITECUSTOMIZE
        + "\nimport os as _os\n"
        + f"if _os.environ.get({ENV_FLAG!r}) == '1':\n"
        + f"    sys.path.insert(0, {str(HERE)!r})\n"
        + "    import cpu_harness\n"
        + "    cpu_harness.patch_worker()\n"
    )
    return target


# ----------------------------------------------------------------------------------------------------------
# Worker side


def _cpu(device):
    """'cuda', 'cuda:0', torch.device('cuda'), an int GPU index -> 'cpu'; anything else unchanged."""
    import torch

    if isinstance(device, int) and not isinstance(device, bool):
        return "cpu"
    if isinstance(device, str) and device.startswith("cuda"):
        return "cpu"
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _remap_kwargs(kwargs: dict) -> dict:
    if "device" in kwargs:
        kwargs["device"] = _cpu(kwargs["device"])
    kwargs.pop("pin_memory", None)  # needs a CUDA runtime (dtensor_policy_worker.py:157, :459, :1751)
    return kwargs


def patch_worker() -> None:  # noqa: C901 - one flat list of patches, each documented
    import torch
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh

    if getattr(torch, "_rise_cpu_harness", False):
        return
    torch._rise_cpu_harness = True
    os.environ.setdefault("NRL_DISABLE_NUMA_BINDING", "1")  # numa_utils.py:58: no GPU affinity file here

    # 1. "cuda" device arguments -> cpu: dtensor_policy_worker.py:594,628,651,680,715,735,971,1029,1039,1060
    #    (torch.tensor(..., device="cuda"), .cuda(), data.to("cuda")), move_to_cuda/:1917-1946 (Module.to).
    for name in ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand", "zeros_like",
                 "ones_like", "empty_like", "full_like"):
        orig = getattr(torch, name)

        def factory(*args, __orig=orig, **kwargs):
            return __orig(*args, **_remap_kwargs(kwargs))

        setattr(torch, name, factory)

    tensor_to = torch.Tensor.to

    def to(self, *args, **kwargs):
        args = tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        return tensor_to(self, *args, **_remap_kwargs(kwargs))

    torch.Tensor.to = to
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.Tensor.pin_memory = lambda self, *a, **k: self

    module_to = torch.nn.Module.to

    def module_to_cpu(self, *args, **kwargs):
        args = tuple(_cpu(a) if isinstance(a, (str, torch.device)) else a for a in args)
        return module_to(self, *args, **_remap_kwargs(kwargs))

    torch.nn.Module.to = module_to_cpu
    torch.nn.Module.cuda = lambda self, *a, **k: self

    # 2. torch.autocast(device_type="cuda", dtype=...) (dtensor_policy_worker.py:713,792,1138): CPU autocast
    #    with the configured dtype (float32 in the test: autocast then changes nothing).
    autocast = torch.autocast

    class cpu_autocast(autocast):
        def __init__(self, device_type, *args, **kwargs):
            super().__init__("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    torch.autocast = cpu_autocast

    # 3. torch.cuda calls with no CPU meaning: synchronize (:162, :1793), empty_cache (:711, :967, :1929...),
    #    memory stats (:1971-1972), get_device_name (:985, a metrics string), current_device
    #    (base_policy_worker.py:44,70,94), nvtx ranges in the @wrap_with_nvtx_name decorator (utils/nsys.py:117-120).
    cuda = torch.cuda
    cuda.synchronize = lambda *a, **k: None
    cuda.empty_cache = lambda *a, **k: None
    cuda.memory_allocated = lambda *a, **k: 0
    cuda.memory_reserved = lambda *a, **k: 0
    cuda.max_memory_allocated = lambda *a, **k: 0
    cuda.reset_peak_memory_stats = lambda *a, **k: None
    cuda.get_device_name = lambda *a, **k: "cpu (rise_nemo test harness)"
    cuda.current_device = lambda: 0
    cuda.set_device = lambda *a, **k: None
    cuda.nvtx.range_push = lambda *a, **k: None
    cuda.nvtx.range_pop = lambda *a, **k: None

    # 4. nccl -> gloo (dtensor_policy_worker.py:241): the only CPU collective backend; one rank here.
    init_pg = dist.init_process_group

    def init_process_group(*args, **kwargs):
        if kwargs.get("backend") == "nccl":
            kwargs["backend"] = "gloo"
        if args and args[0] == "nccl":
            args = ("gloo",) + args[1:]
        return init_pg(*args, **kwargs)

    dist.init_process_group = init_process_group

    # 5. the device mesh on cpu (dtensor_policy_worker.py:386-387 init_device_mesh("cuda", ...)).
    init_mesh = device_mesh.init_device_mesh

    def init_device_mesh(device_type, *args, **kwargs):
        return init_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    device_mesh.init_device_mesh = init_device_mesh
    dist.device_mesh.init_device_mesh = init_device_mesh

    # 6. ray.get_gpu_ids() -> [0] (dtensor_policy_worker.py:209 indexes [0]; the cluster has no GPUs).
    import ray

    ray.get_gpu_ids = lambda: [0]
