"""Per-GPU memory estimate of a NeMo-RL recipe, term by term, per phase.

A colocated step has two phases on the same GPUs: **training** (Megatron policy resident: weights, grads,
optimizer shard, activations, logits; vLLM asleep) and **generation** (vLLM awake with its memory pool;
policy weights and optimizer offloaded to host, as NeMo-RL's ``offload_before_refit`` /
``offload_after_refit`` do). Distillation adds a **teacher** phase (teacher forward only); PPO-style
methods add a **critic** phase (the value model, a second full model with its own optimizer, in training). A judge runs on
its own nodes. The peak of each phase must fit the GPU. Each colocated worker group has one process per GPU
(NeMo-RL's placement, rise_nemo.backends.nemo.placement): in every phase, the processes of the groups that are
not working keep their CUDA context and NCCL buffers there (``idle_process_terms``, an estimate).

Byte counts (per parameter on a rank, after dividing the stage's parameters by TP):
- weights: bf16 2 B; FP8 training with bf16 params keeps an extra FP8 copy (+1 B, TE's cast cache);
  ``fp8_param`` keeps FP8 params only (1 B);
- grads: Megatron's DDP grad buffer, 2 B (4 B with ``grad_reduce_in_fp32``), not sharded;
- optimizer: fp32 master + Adam m, v = 12 B (8 B with the precision-aware optimizer's bf16 moments),
  divided by DP with the distributed optimizer;
- activations per token per layer (bf16, flash attention, SwiGLU), what autograd keeps for backward:
  4 h (norm inputs, residual stream; divided by TP only with sequence parallel) + 2 h_q + 2 kv + 3 ffn
  (q/k/v, attention output, gate/up/SwiGLU outputs; divided by TP). Full recompute keeps only each layer's
  h-input plus one layer's full set. The first pipeline stage holds min(PP, micro-batches) micro-batches in
  flight (1F1B). Tokens per micro-batch = max_total_sequence_length x micro-batch size (with sequence
  packing: train_mb_tokens), divided by CP.
- logits on the last stage: fp32 logits and their gradient, tokens x vocab / TP x 8 B.
These are estimates for planning, not measurements; docs/planner.md says how they compare with NeMo-RL's own
memory tracker on a real run when one is available.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rise_nemo.planner.layout import VLLM_PRECISIONS, GenerationLayout, JudgeLayout, PolicyLayout
from rise_nemo.planner.models import ModelShape
from rise_nemo.recipe_keys import get

GIB = 1024**3
RUNTIME_OVERHEAD_GIB = 4.0  # CUDA context, NCCL buffers, allocator fragmentation of the process that works
# Every colocated worker process on a GPU keeps its CUDA context and NCCL communicator buffers while another
# group works there (1-3 GiB each, depending on the number of communicators): an estimate, not a measurement.
IDLE_PROCESS_GIB = 2.0
VLLM_WORKSPACE_GIB = 2.0  # vLLM's activation workspace / CUDA graphs inside its pool

# The worker process of each colocated group on a training GPU, and the phase in which it is the one working.
POLICY_PROCESS, VLLM_PROCESS, VALUE_PROCESS, TEACHER_PROCESS = "policy", "vLLM", "value model", "teacher"
WORKING = {"training": POLICY_PROCESS, "generation": VLLM_PROCESS, "critic": VALUE_PROCESS,
           "teacher": TEACHER_PROCESS}


@dataclass(frozen=True)
class Term:
    phase: str  # "training" | "generation" | "teacher" | "judge"
    label: str
    gib: float


def stage_params(model: ModelShape, pp: int) -> int:
    """Parameters on the heaviest pipeline stage: its layers plus the embedding (first stage) and the
    output layer (last stage); with PP 1 both sit on the one stage (tied: one copy)."""
    layers = -(-model.layers // pp) * model.layer_params
    if pp == 1:
        heads = 1 if model.tied_embeddings else 2
        return layers + heads * model.embedding_params + model.hidden
    # Megatron keeps a separate output-layer copy on the last stage even when embeddings are tied.
    return layers + model.embedding_params + model.hidden


def activation_bytes_per_token_layer(model: ModelShape, tp: int, sequence_parallel: bool) -> float:
    h_terms = 4 * model.hidden / (tp if sequence_parallel else 1)
    tp_terms = (2 * model.heads * model.head_dim + 2 * model.kv_heads * model.head_dim + 3 * model.ffn) / tp
    return 2.0 * (h_terms + tp_terms)


def training_terms(tree: Mapping[str, Any], layout: PolicyLayout, prefix: str = "nemo.policy",
                   phase: str = "training", who: str = "policy", outputs: int | None = None) -> list[Term]:
    """Terms of one Megatron model in training. ``outputs``: width of the last layer's output (the vocabulary
    for an LM head, 1 for a value head)."""
    m, tp, pp, cp, dp = layout.model, layout.tp, layout.pp, layout.cp, max(1, layout.dp)
    mcfg = f"{prefix}.megatron_cfg"
    params = stage_params(m, pp) / tp
    fp8 = bool(get(tree, f"{mcfg}.fp8_cfg.enabled", False, bool))
    fp8_param = fp8 and bool(get(tree, f"{mcfg}.fp8_cfg.fp8_param", False, bool))
    if fp8_param:
        w_bytes, w_label = 1.0, f"{who} weights (FP8 params)"
    elif fp8:
        w_bytes, w_label = 3.0, f"{who} weights (bf16 + FP8 copy)"
    else:
        w_bytes, w_label = 2.0, f"{who} weights (bf16)"
    grad_bytes = 4.0 if get(tree, f"{mcfg}.distributed_data_parallel_config.grad_reduce_in_fp32", False, bool) else 2.0
    precision_aware = bool(get(tree, f"{mcfg}.optimizer.use_precision_aware_optimizer", False, bool))
    opt_bytes = 8.0 if precision_aware else 12.0
    distributed = bool(get(tree, f"{mcfg}.optimizer.use_distributed_optimizer", True, bool))
    opt_shards = dp if distributed else 1

    seq = get(tree, f"{prefix}.max_total_sequence_length", typ=int)
    mbs = get(tree, f"{prefix}.train_micro_batch_size", 1, int)
    if get(tree, f"{prefix}.sequence_packing.enabled", False, bool):
        # packed micro-batches hold up to train_mb_tokens tokens, whatever the micro-batch size says
        tokens = get(tree, f"{prefix}.sequence_packing.train_mb_tokens", seq * mbs, int) / cp
    else:
        tokens = seq * mbs / cp
    layers_per_stage = -(-m.layers // pp)
    per_layer = activation_bytes_per_token_layer(m, tp, layout.sequence_parallel)
    # Selective recompute re-runs only core attention, which flash attention already does not store: it
    # saves nothing here, so only granularity "full" counts as recompute.
    recompute = bool(get(tree, f"{mcfg}.activation_checkpointing", False, bool)) and (
        get(tree, f"{mcfg}.recompute_granularity", "full", str) == "full")
    if recompute:
        kept = 2.0 * m.hidden / (tp if layout.sequence_parallel else 1)  # each layer's input only
        act_one_mb = tokens * (layers_per_stage * kept + per_layer)
        act_label = "activations (full recompute)"
    else:
        act_one_mb = tokens * layers_per_stage * per_layer
        act_label = "activations (no recompute)"
    in_flight = pp  # 1F1B: the first stage holds up to PP micro-batches
    width = m.vocab if outputs is None else outputs
    logits = tokens * width / (tp if outputs is None else 1) * 8.0
    return [
        Term(phase, w_label, params * w_bytes / GIB),
        Term(phase, f"grads ({int(grad_bytes * 8)}-bit buffer)", params * grad_bytes / GIB),
        Term(phase, f"optimizer states ({'/DP ' + str(opt_shards) if distributed else 'replicated'})",
             params * opt_bytes / opt_shards / GIB),
        Term(phase, f"{act_label}, {in_flight} micro-batch(es) in flight", act_one_mb * in_flight / GIB),
        Term(phase, "logits + grad (fp32, last stage)" if outputs is None else "value head output + grad (fp32)",
             logits / GIB),
        Term(phase, "runtime (CUDA/NCCL/allocator)", RUNTIME_OVERHEAD_GIB),
    ]


def critic_terms(value_tree: Mapping[str, Any], critic: PolicyLayout) -> list[Term]:
    """The value model's training phase (PPO): a second full model with its own grads and optimizer shard,
    trained while vLLM sleeps and with the policy's weights, grads and optimizer off the GPUs: the nemo
    backend offloads the policy before the value model loads (``NemoSession.offload_policy``), as NeMo-RL's
    ppo.py has it offloaded then (``finish_inference``, ppo.py:1204; value training first, :1255-1287).
    ``value_tree`` holds the critic's full config under ``nemo.value`` (``planner.critic.value_config``)."""
    return training_terms(value_tree, critic, "nemo.value", phase="critic", who="critic", outputs=1)


def vllm_pool_terms(gen: GenerationLayout, model: ModelShape, gpu_mem_gib: float, phase: str) -> tuple[list[Term], float]:
    """vLLM reserves gpu_memory_utilization x GPU memory for weights, workspace and KV cache.

    Returns (terms, sequences the KV cache holds at max_model_len)."""
    pool = gen.gpu_memory_utilization * gpu_mem_gib
    w_bytes, label = VLLM_PRECISIONS.get(gen.precision, (2.0, gen.precision))  # unknown: a plan issue already
    weights = model.total_params * w_bytes / (gen.tp * gen.pp) / GIB
    kv_bytes = 1.0 if gen.kv_cache_dtype == "fp8" else 2.0
    kv = max(0.0, pool - weights - VLLM_WORKSPACE_GIB)
    per_seq = model.kv_bytes_per_token(kv_bytes) / (min(gen.tp, model.kv_heads) * gen.pp) * gen.max_model_len / GIB
    seqs = kv / per_seq if per_seq else 0.0
    return [
        Term(phase, f"vLLM weights ({label}, TP {gen.tp})", weights),
        Term(phase, "vLLM workspace", VLLM_WORKSPACE_GIB),
        Term(phase, f"vLLM KV cache ({seqs:.0f} seqs x {gen.max_model_len} tok)", kv),
    ], seqs


def generation_terms(gen: GenerationLayout, model: ModelShape, gpu_mem_gib: float) -> tuple[list[Term], float]:
    return vllm_pool_terms(gen, model, gpu_mem_gib, "generation")


def idle_process_terms(phase: str, processes: list[str]) -> list[Term]:
    """The colocated worker processes that do not work in ``phase``: their weights and optimizer are offloaded
    (vLLM asleep), but each keeps its CUDA context and NCCL buffers on the GPU (``IDLE_PROCESS_GIB``, estimate)."""
    return [Term(phase, f"{p} process idle: CUDA context + NCCL buffers (estimate)", IDLE_PROCESS_GIB)
            for p in processes if p != WORKING.get(phase)]


def teacher_terms(tree: Mapping[str, Any], teacher: PolicyLayout, student: PolicyLayout) -> list[Term]:
    """Teacher forward (top-k logits) while the student's weights and grad buffer stay resident."""
    m = teacher.model
    params = stage_params(m, teacher.pp) / teacher.tp
    seq = get(tree, "nemo.teacher.max_total_sequence_length", None, int) or get(
        tree, "nemo.policy.max_total_sequence_length", typ=int)
    mbs = get(tree, "nemo.teacher.train_micro_batch_size", None, int) or 1
    tokens = seq * mbs / teacher.cp
    student_resident = stage_params(student.model, student.pp) / student.tp * (2.0 + 2.0)
    one_layer = tokens * activation_bytes_per_token_layer(m, teacher.tp, teacher.sequence_parallel)
    return [
        Term("teacher", f"teacher weights (bf16, {m.name})", params * 2.0 / GIB),
        Term("teacher", "teacher forward activations + fp32 logits", (one_layer + tokens * m.vocab / teacher.tp * 4.0) / GIB),
        Term("teacher", "student weights + grad buffer (resident)", student_resident / GIB),
        Term("teacher", "runtime (CUDA/NCCL/allocator)", RUNTIME_OVERHEAD_GIB),
    ]


def judge_terms(judge: JudgeLayout, gpu_mem_gib: float) -> tuple[list[Term], float]:
    gen = GenerationLayout(True, judge.nodes * judge.gpus_per_node, judge.nodes, judge.tp, 1, "bfloat16", "auto",
                           judge.gpu_memory_utilization, judge.max_model_len)
    return vllm_pool_terms(gen, judge.model, gpu_mem_gib, "judge")
