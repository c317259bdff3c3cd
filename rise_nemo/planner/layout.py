"""Parallel layout of a NeMo-RL recipe: read it from the recipe tree and check it before any GPU is touched.

Every check returns a ``PlanIssue`` whose message names the recipe key to change, e.g.
``nemo.policy.megatron_cfg.tensor_model_parallel_size=3 does not divide 40 attention heads``.
No torch, no NeMo-RL: this runs in the CLI in milliseconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rise_nemo.methods.registry import DEFAULT_METHOD, METHODS
from rise_nemo.planner.critic import value_config
from rise_nemo.planner.models import ModelShape
from rise_nemo.recipe_keys import RecipeKeyError, get

MEGATRON = "nemo.policy.megatron_cfg"
VLLM = "nemo.policy.generation.vllm_cfg"
# vllm_cfg.precision -> (weight bytes per parameter, report label); float32: CPU functional runs of tiny models.
VLLM_PRECISIONS = {"fp8": (1.0, "FP8"), "bfloat16": (2.0, "bf16"), "float16": (2.0, "fp16"), "float32": (4.0, "fp32")}
FP8_FORMATS = ("e4m3", "hybrid")
FP8_RECIPES = ("blockwise", "tensorwise", "mxfp8")


@dataclass(frozen=True)
class PlanIssue:
    key: str  # dotted recipe key to change
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@dataclass(frozen=True)
class PolicyLayout:
    """The training layout (one model: the policy, or a distillation teacher): Megatron's, or DTensor's (FSDP2)
    when ``megatron_cfg.enabled`` is false and ``dtensor_cfg.enabled`` true (NeMo-RL's rule, lm_policy.py:90-91;
    no PP there; its memory is estimated as Megatron's with the distributed optimizer: FSDP2 shards weights,
    gradients and optimizer state over DP alike)."""

    model: ModelShape
    world: int  # training GPUs
    tp: int
    pp: int
    cp: int
    sequence_parallel: bool
    prefix: str = MEGATRON
    tp_key: str = "tensor_model_parallel_size"  # the TP key's name under prefix (DTensor: tensor_parallel_size)

    @property
    def dp(self) -> int:
        return self.world // (self.tp * self.pp * self.cp)


@dataclass(frozen=True)
class GenerationLayout:
    colocated: bool
    gpus: int  # GPUs vLLM runs on (all training GPUs when colocated)
    nodes: int  # dedicated generation nodes (0 when colocated)
    tp: int
    pp: int
    precision: str  # VLLM_PRECISIONS key: "bfloat16" | "fp8" | "float16" | "float32" (CPU functional runs)
    kv_cache_dtype: str  # "auto" (= model dtype) | "fp8"
    gpu_memory_utilization: float
    max_model_len: int

    @property
    def engines(self) -> int:
        return self.gpus // (self.tp * self.pp)


@dataclass(frozen=True)
class JudgeLayout:
    model: ModelShape
    nodes: int
    gpus_per_node: int
    tp: int
    gpu_memory_utilization: float
    max_model_len: int

    @property
    def servers(self) -> int:
        return self.nodes * self.gpus_per_node // self.tp


@dataclass
class RecipeLayout:
    name: str
    nodes_total: int
    gpus_per_node: int
    train_nodes: int
    policy: PolicyLayout
    generation: GenerationLayout | None
    teacher: PolicyLayout | None
    judge: JudgeLayout | None
    issues: list[PlanIssue] = field(default_factory=list)
    critic: PolicyLayout | None = None  # PPO's value model (nemo.value), time-shared with the policy
    value_tree: dict[str, Any] | None = None  # {"nemo": {"value": full ValueConfig}} for the memory terms


def check_divisibility(layout: PolicyLayout, gpus_per_node: int) -> list[PlanIssue]:
    """TP x PP x CP x DP = GPUs; heads, KV heads and layers divisible; SP needs TP > 1; TP within a node."""
    m, p = layout.model, layout.prefix
    out = []
    mp = layout.tp * layout.pp * layout.cp
    if layout.world % mp:
        out.append(PlanIssue(
            f"{p}.{layout.tp_key}",
            f"TP {layout.tp} x PP {layout.pp} x CP {layout.cp} = {mp} does not divide the {layout.world} training GPUs",
        ))
    if m.heads % layout.tp:
        out.append(PlanIssue(f"{p}.{layout.tp_key}",
                             f"TP {layout.tp} does not divide {m.name}'s {m.heads} attention heads"))
    if m.kv_heads % layout.tp:
        out.append(PlanIssue(f"{p}.{layout.tp_key}",
                             f"TP {layout.tp} does not divide {m.name}'s {m.kv_heads} KV heads (query groups)"))
    if m.layers % layout.pp:
        out.append(PlanIssue(f"{p}.pipeline_model_parallel_size",
                             f"PP {layout.pp} does not divide {m.name}'s {m.layers} layers"))
    if layout.sequence_parallel and layout.tp == 1:
        out.append(PlanIssue(f"{p}.sequence_parallel", f"sequence parallel needs {layout.tp_key} > 1"))
    if layout.tp > gpus_per_node:
        out.append(PlanIssue(f"{p}.{layout.tp_key}",
                             f"TP {layout.tp} spans more than one {gpus_per_node}-GPU node (NVLink domain)"))
    return out


def rows_per_step(tree: Mapping[str, Any]) -> tuple[int, str]:
    """(sampled rows per step, the key to change): GRPO's prompts x group, or distillation's prompts x gens."""
    if get(tree, "nemo.distillation", None) is not None:
        return (get(tree, "nemo.distillation.num_prompts_per_step", typ=int)
                * get(tree, "nemo.distillation.num_generations_per_prompt", 1, int),
                "nemo.distillation.num_prompts_per_step")
    return get(tree, "sampling.prompts_per_step", 8, int) * get(tree, "sampling.group_size", 8, int), "sampling.prompts_per_step"


def check_batches(tree: Mapping[str, Any], layout: PolicyLayout) -> list[PlanIssue]:
    """Natural rows per step and NeMo-RL's global batch must fill whole DP x micro-batch slices."""
    out = []
    if layout.world % (layout.tp * layout.pp * layout.cp):
        return out  # the DP size is undefined; already reported
    mbs = get(tree, "nemo.policy.train_micro_batch_size", typ=int)
    if mbs < 1:
        out.append(PlanIssue("nemo.policy.train_micro_batch_size", f"must be >= 1, got {mbs}"))
        return out
    slice_rows = layout.dp * mbs
    rows, key = rows_per_step(tree)
    if rows % slice_rows:
        out.append(PlanIssue(
            key,
            f"{rows} sampled rows per step (prompts x samples per prompt) are not a multiple of "
            f"DP {layout.dp} x train_micro_batch_size {mbs} = {slice_rows}",
        ))
    gbs = get(tree, "nemo.policy.train_global_batch_size", None, int)
    if gbs is not None and gbs % slice_rows:
        out.append(PlanIssue("nemo.policy.train_global_batch_size",
                             f"{gbs} is not a multiple of DP {layout.dp} x train_micro_batch_size {mbs}"))
    most = max_train_rows(tree)
    if gbs is not None and most is not None and gbs < most:
        # The nemo backend pads every step to exactly train_global_batch_size rows (constant LR-scheduler ticks).
        out.append(PlanIssue("nemo.policy.train_global_batch_size",
                             f"{gbs} is less than the {most} training rows a step can have (prompts_per_step x "
                             "(group_size + privileged_group_size))"))
    return out


def padding_note(tree: Mapping[str, Any]) -> str | None:
    """A global batch larger than any step's rows is valid but wasteful: every step is padded to it with
    masked rows (a 512-row GRPO step under a guided recipe's 1024 trains half padding)."""
    gbs = get(tree, "nemo.policy.train_global_batch_size", None, int)
    most = max_train_rows(tree)
    if gbs is None or most is None or gbs <= most:
        return None
    return (f"nemo.policy.train_global_batch_size {gbs} is more than the {most} training rows a step of method "
            f"{get(tree, 'method', DEFAULT_METHOD)!r} can have: every step is padded with {gbs - most} masked rows "
            f"(set it to {most})")


def _guided(name: str) -> bool:
    """Whether the method's steps add privileged rows to the train batch (``Method.guided_rows``)."""
    method = METHODS.get(name)
    return method is not None and method.guided_rows


def max_train_rows(tree: Mapping[str, Any]) -> int | None:
    """Most rows one RL step can train on (None for distillation, which NeMo-RL batches itself)."""
    if get(tree, "nemo.distillation", None) is not None:
        return None
    group = get(tree, "sampling.group_size", 8, int)
    rows = get(tree, "sampling.prompts_per_step", 8, int) * group
    if _guided(str(get(tree, "method", DEFAULT_METHOD))):
        rows += get(tree, "sampling.prompts_per_step", 8, int) * (get(tree, "rise.privileged_group_size", None, int) or group)
    return rows


def check_sequence(tree: Mapping[str, Any], layout: PolicyLayout) -> list[PlanIssue]:
    out = []
    seq = get(tree, "nemo.policy.max_total_sequence_length", typ=int)
    new = get(tree, "sampling.max_new_tokens", None, int)
    if new is not None and new >= seq:
        out.append(PlanIssue("nemo.policy.max_total_sequence_length",
                             f"{seq} leaves no room for the prompt next to sampling.max_new_tokens={new}"))
    div = get(tree, "nemo.policy.make_sequence_length_divisible_by", 1, int)
    need = layout.tp if layout.sequence_parallel else 1
    if layout.cp > 1:
        need = need * 2 * layout.cp  # CP load-balancing splits each sequence into 2 x CP chunks
    if div % need:
        out.append(PlanIssue("nemo.policy.make_sequence_length_divisible_by",
                             f"{div} must be a multiple of {need} (TP with sequence parallel x 2 CP)"))
    return out


def check_fp8(tree: Mapping[str, Any]) -> list[PlanIssue]:
    out = []
    if not get(tree, f"{MEGATRON}.fp8_cfg.enabled", False, bool):
        return out
    fmt = get(tree, f"{MEGATRON}.fp8_cfg.fp8", "e4m3", str)
    recipe = get(tree, f"{MEGATRON}.fp8_cfg.fp8_recipe", "blockwise", str)
    if fmt not in FP8_FORMATS:
        out.append(PlanIssue(f"{MEGATRON}.fp8_cfg.fp8", f"{fmt!r} is not one of {FP8_FORMATS}"))
    if recipe not in FP8_RECIPES:
        out.append(PlanIssue(f"{MEGATRON}.fp8_cfg.fp8_recipe", f"{recipe!r} is not one of {FP8_RECIPES}"))
    if recipe == "blockwise":
        scales = str(get(tree, f"{MEGATRON}.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES", "0"))
        if scales != "1":
            out.append(PlanIssue(f"{MEGATRON}.env_vars.NVTE_FP8_BLOCK_SCALING_FP32_SCALES",
                                 "blockwise FP8 on Hopper needs this set to \"1\""))
    if get(tree, f"{MEGATRON}.optimizer.use_precision_aware_optimizer", False, bool):
        out.append(PlanIssue(f"{MEGATRON}.optimizer.use_precision_aware_optimizer",
                             "must be false with FP8 training (NeMo-RL's FP8 recipes turn it off)"))
    return out


def check_generation(tree: Mapping[str, Any], gen: GenerationLayout, model: ModelShape, gpus_per_node: int,
                     seq: int) -> list[PlanIssue]:
    out = []
    if get(tree, "nemo.policy.generation.backend", "vllm", str) != "vllm":
        out.append(PlanIssue("nemo.policy.generation.backend", "the nemo backend generates with vLLM only"))
    if gen.tp > gpus_per_node:
        out.append(PlanIssue(f"{VLLM}.tensor_parallel_size",
                             f"vLLM TP {gen.tp} does not fit one {gpus_per_node}-GPU node"))
    if model.heads % gen.tp:
        out.append(PlanIssue(f"{VLLM}.tensor_parallel_size",
                             f"vLLM TP {gen.tp} does not divide {model.name}'s {model.heads} attention heads"))
    if gen.gpus % (gen.tp * gen.pp):
        out.append(PlanIssue(f"{VLLM}.tensor_parallel_size",
                             f"vLLM TP {gen.tp} x PP {gen.pp} does not divide the {gen.gpus} generation GPUs"))
    if not 0 < gen.gpu_memory_utilization <= 1:
        out.append(PlanIssue(f"{VLLM}.gpu_memory_utilization", f"must be in (0, 1], got {gen.gpu_memory_utilization}"))
    if gen.max_model_len < seq:
        out.append(PlanIssue(f"{VLLM}.max_model_len",
                             f"{gen.max_model_len} is shorter than policy.max_total_sequence_length {seq}"))
    if gen.precision not in VLLM_PRECISIONS:
        out.append(PlanIssue(f"{VLLM}.precision", f"{gen.precision!r} is not one of {sorted(VLLM_PRECISIONS)}"))
    if gen.precision == "fp8" and get(tree, "nemo.adapter.importance_sampling", "none", str) == "none":
        out.append(PlanIssue("nemo.adapter.importance_sampling",
                             "FP8 rollouts differ from the trainer's distribution: set behaviour_ratio"))
    return out


def _policy_layout(tree, prefix_key: str, model: ModelShape, world: int) -> PolicyLayout:
    megatron = bool(get(tree, f"{prefix_key}.megatron_cfg.enabled", True, bool))
    if not megatron and bool(get(tree, f"{prefix_key}.dtensor_cfg.enabled", False, bool)):
        dt = f"{prefix_key}.dtensor_cfg"
        return PolicyLayout(
            model=model, world=world, tp=get(tree, f"{dt}.tensor_parallel_size", 1, int), pp=1,
            cp=get(tree, f"{dt}.context_parallel_size", 1, int),
            sequence_parallel=bool(get(tree, f"{dt}.sequence_parallel", False, bool)), prefix=dt,
            tp_key="tensor_parallel_size",
        )
    return PolicyLayout(
        model=model,
        world=world,
        tp=get(tree, f"{prefix_key}.megatron_cfg.tensor_model_parallel_size", 1, int),
        pp=get(tree, f"{prefix_key}.megatron_cfg.pipeline_model_parallel_size", 1, int),
        cp=get(tree, f"{prefix_key}.megatron_cfg.context_parallel_size", 1, int),
        sequence_parallel=bool(get(tree, f"{prefix_key}.megatron_cfg.sequence_parallel", False, bool)),
        prefix=f"{prefix_key}.megatron_cfg",
    )


def nodes_from_cluster(tree: Mapping[str, Any]) -> int:
    """Total nodes implied by ``nemo.cluster.num_nodes`` (training) + dedicated generation + judge nodes: what a
    launched run actually has (a launcher may override cluster.num_nodes to the allocation's size)."""
    colocated = bool(get(tree, "nemo.policy.generation.colocated.enabled", True, bool))
    gen = 0 if colocated else get(tree, "nemo.policy.generation.colocated.resources.num_nodes", typ=int)
    return get(tree, "nemo.cluster.num_nodes", typ=int) + gen + get(tree, "nemo.plan.judge.nodes", 0, int)


def read_layout(tree: Mapping[str, Any], resolve_model, nodes: int | None, gpus_per_node: int | None) -> RecipeLayout:
    """Build the layout from the recipe tree; ``nodes``/``gpus_per_node`` override the recipe's own.

    ``nodes`` is the TOTAL node count (training + dedicated generation + judge nodes), as in ``--nodes``.
    """
    name = get(tree, "run.name", "recipe", str)
    gpn = gpus_per_node or get(tree, "nemo.cluster.gpus_per_node", typ=int)
    judge_nodes = get(tree, "nemo.plan.judge.nodes", 0, int)
    colocated = bool(get(tree, "nemo.policy.generation.colocated.enabled", True, bool))
    gen_nodes = 0 if colocated else get(tree, "nemo.policy.generation.colocated.resources.num_nodes", typ=int)
    documented = get(tree, "nemo.plan.nodes", typ=int)
    total = nodes if nodes is not None else documented
    issues: list[PlanIssue] = []
    train_nodes = total - judge_nodes - gen_nodes
    cluster_nodes = get(tree, "nemo.cluster.num_nodes", typ=int)
    if nodes is None and cluster_nodes != train_nodes:
        issues.append(PlanIssue(
            "nemo.cluster.num_nodes",
            f"{cluster_nodes} training nodes, but plan.nodes {documented} - judge {judge_nodes} - "
            f"generation {gen_nodes} leaves {train_nodes}",
        ))
    if train_nodes < 1:
        raise RecipeKeyError(f"{total} node(s) leave no training node after {judge_nodes} judge and "
                             f"{gen_nodes} generation node(s) (nemo.plan.judge.nodes)")
    world = train_nodes * gpn
    policy = _policy_layout(tree, "nemo.policy", resolve_model(get(tree, "nemo.policy.model_name", typ=str)), world)

    gen = None
    if get(tree, "nemo.policy.generation", None) is not None:
        gen = GenerationLayout(
            colocated=colocated,
            gpus=world if colocated else gen_nodes * gpn,
            nodes=gen_nodes,
            tp=get(tree, f"{VLLM}.tensor_parallel_size", 1, int),
            pp=get(tree, f"{VLLM}.pipeline_parallel_size", 1, int),
            precision=get(tree, f"{VLLM}.precision", "bfloat16", str),
            kv_cache_dtype=get(tree, f"{VLLM}.kv_cache_dtype", "auto", str),
            gpu_memory_utilization=float(get(tree, f"{VLLM}.gpu_memory_utilization", 0.6, (int, float))),
            max_model_len=get(tree, f"{VLLM}.max_model_len", typ=int),
        )
    teacher = None
    if get(tree, "nemo.teacher", None) is not None:
        teacher = _policy_layout(tree, "nemo.teacher", resolve_model(get(tree, "nemo.teacher.model_name", typ=str)),
                                 world)
    judge = None
    if judge_nodes:
        judge = JudgeLayout(
            model=resolve_model(get(tree, "nemo.plan.judge.model", typ=str)),
            nodes=judge_nodes,
            gpus_per_node=gpn,
            tp=get(tree, "nemo.plan.judge.tensor_parallel_size", 1, int),
            gpu_memory_utilization=float(get(tree, "nemo.plan.judge.gpu_memory_utilization", 0.9, (int, float))),
            max_model_len=get(tree, "nemo.plan.judge.max_model_len", 16384, int),
        )
    layout = RecipeLayout(name, total, gpn, train_nodes, policy, gen, teacher, judge, issues)
    if get(tree, "nemo.value", None) is not None:
        layout.value_tree = {"nemo": {"value": value_config(get(tree, "nemo.policy"), get(tree, "nemo.value"))}}
        layout.critic = _policy_layout(layout.value_tree, "nemo.value",
                                       resolve_model(get(layout.value_tree, "nemo.value.model_name", typ=str)), world)
    layout.issues += validate(tree, layout)
    return layout


def validate(tree: Mapping[str, Any], layout: RecipeLayout) -> list[PlanIssue]:
    out = check_divisibility(layout.policy, layout.gpus_per_node)
    out += check_batches(tree, layout.policy)
    out += check_sequence(tree, layout.policy)
    out += check_fp8(tree)
    seq = get(tree, "nemo.policy.max_total_sequence_length", typ=int)
    if layout.generation is not None:
        out += check_generation(tree, layout.generation, layout.policy.model, layout.gpus_per_node, seq)
    if layout.critic is not None:
        out += check_divisibility(layout.critic, layout.gpus_per_node)
    if layout.teacher is not None:
        out += check_divisibility(layout.teacher, layout.gpus_per_node)
        if layout.teacher.model.vocab != layout.policy.model.vocab:
            out.append(PlanIssue("nemo.teacher.model_name", "teacher and student vocabularies differ"))
    if layout.judge is not None:
        j = layout.judge
        if j.tp > j.gpus_per_node or (j.nodes * j.gpus_per_node) % j.tp:
            out.append(PlanIssue("nemo.plan.judge.tensor_parallel_size",
                                 f"judge TP {j.tp} must fit a node and divide {j.nodes * j.gpus_per_node} GPUs"))
        if j.model.heads % j.tp:
            out.append(PlanIssue("nemo.plan.judge.tensor_parallel_size",
                                 f"judge TP {j.tp} does not divide {j.model.name}'s {j.model.heads} heads"))
    return out
