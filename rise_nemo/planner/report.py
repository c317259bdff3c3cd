"""``plan_recipe``: layout checks + per-GPU memory estimate of one recipe, and its printable table."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rise_nemo.planner import memory
from rise_nemo.planner.layout import PlanIssue, RecipeLayout, padding_note, read_layout
from rise_nemo.planner.models import resolve_model
from rise_nemo.recipe_keys import RecipeKeyError

DEFAULT_GPU_MEM_GIB = 141.0  # H200


@dataclass
class PlanReport:
    layout: RecipeLayout
    gpu_mem_gib: float
    terms: list[memory.Term]
    kv_sequences: float | None = None
    issues: list[PlanIssue] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # valid but worth changing; never a failure

    def phase_total(self, phase: str) -> float:
        return sum(t.gib for t in self.terms if t.phase == phase)

    @property
    def phases(self) -> list[str]:
        seen: list[str] = []
        for t in self.terms:
            if t.phase not in seen:
                seen.append(t.phase)
        return seen

    @property
    def peak_phase(self) -> str:
        gpu_phases = [p for p in self.phases if p != "judge"]
        return max(gpu_phases, key=self.phase_total)

    @property
    def peak_gib(self) -> float:
        return self.phase_total(self.peak_phase)

    @property
    def largest_term(self) -> memory.Term:
        return max((t for t in self.terms if t.phase == self.peak_phase), key=lambda t: t.gib)

    @property
    def ok(self) -> bool:
        return not self.issues


def plan_recipe(
    tree: Mapping[str, Any],
    nodes: int | None = None,
    gpus_per_node: int | None = None,
    gpu_mem_gib: float = DEFAULT_GPU_MEM_GIB,
) -> PlanReport:
    """Check a resolved recipe tree (plain dicts) and estimate its per-GPU memory.

    Raises ``RecipeKeyError`` for a missing/mistyped key and ``ModelShapeError`` for an unknown model; a
    layout or memory problem is reported in ``PlanReport.issues`` (the CLI exits non-zero on any)."""
    if tree.get("backend") != "nemo":
        raise RecipeKeyError(
            f"recipe key backend is {tree.get('backend')!r}: `plan` checks NeMo-RL recipes (backend: nemo)"
        )
    layout = read_layout(tree, resolve_model, nodes, gpus_per_node)
    report = PlanReport(layout, gpu_mem_gib, [], issues=list(layout.issues))
    note = padding_note(tree)
    if note is not None:
        report.notes.append(note)
    processes = colocated_processes(layout)
    report.terms += memory.training_terms(tree, layout.policy)
    report.terms += memory.idle_process_terms("training", processes)
    gen = layout.generation
    if gen is not None:
        gen_terms, seqs = memory.generation_terms(gen, layout.policy.model, gpu_mem_gib)
        report.kv_sequences = seqs
        report.terms += gen_terms
        if gen.colocated:
            report.terms += memory.idle_process_terms("generation", processes)
        if seqs < 1:
            report.issues.append(PlanIssue(
                "nemo.policy.generation.vllm_cfg.gpu_memory_utilization",
                f"vLLM's KV cache cannot hold one {gen.max_model_len}-token sequence ({seqs:.2f})",
            ))
    if layout.teacher is not None:
        report.terms += memory.teacher_terms(tree, layout.teacher, layout.policy)
        report.terms += memory.idle_process_terms("teacher", [p for p in processes if p != memory.POLICY_PROCESS])
    if layout.critic is not None:
        report.terms += memory.critic_terms(layout.value_tree, layout.critic)
        report.terms += memory.idle_process_terms("critic", processes)
    if layout.judge is not None:
        judge_terms, judge_seqs = memory.judge_terms(layout.judge, gpu_mem_gib)
        report.terms += judge_terms
        if judge_seqs < 1:
            report.issues.append(PlanIssue("nemo.plan.judge.gpu_memory_utilization",
                                           f"the judge's KV cache cannot hold one sequence ({judge_seqs:.2f})"))
    for phase in report.phases:
        total = report.phase_total(phase)
        if total > gpu_mem_gib:
            top = max((t for t in report.terms if t.phase == phase), key=lambda t: t.gib)
            report.issues.append(PlanIssue(
                _fix_key(phase, top),
                f"{phase} phase needs {total:.1f} GiB per GPU > {gpu_mem_gib:g} GiB; largest term: "
                f"{top.label} {top.gib:.1f} GiB",
            ))
    return report


def colocated_processes(layout: RecipeLayout) -> list[str]:
    """The worker processes sharing each training GPU, one per colocated worker group (NeMo-RL gives each
    ``1 / groups`` of the GPU in Ray: rise_nemo.backends.nemo.placement)."""
    out = [memory.POLICY_PROCESS]
    if layout.generation is not None and layout.generation.colocated:
        out.append(memory.VLLM_PROCESS)
    if layout.critic is not None:
        out.append(memory.VALUE_PROCESS)
    if layout.teacher is not None:
        out.append(memory.TEACHER_PROCESS)
    return out


def _fix_key(phase: str, term: memory.Term) -> str:
    """The recipe key most likely to fix an over-budget phase, named in the error."""
    if phase in ("generation", "judge"):
        return "nemo.policy.generation.vllm_cfg.tensor_parallel_size" if phase == "generation" \
            else "nemo.plan.judge.tensor_parallel_size"
    if phase == "teacher":
        return "nemo.teacher.megatron_cfg.tensor_model_parallel_size"
    if phase == "critic":
        return "nemo.value.megatron_cfg.tensor_model_parallel_size"
    if term.label.startswith("activations"):
        return "nemo.policy.megatron_cfg.activation_checkpointing"
    return "nemo.policy.megatron_cfg.tensor_model_parallel_size"


def describe_layout(layout: RecipeLayout) -> list[str]:
    p = layout.policy
    m = p.model
    lines = [
        f"model: {m.name} ({m.total_params / 1e9:.2f} B params, {m.layers} layers, {m.heads} heads / "
        f"{m.kv_heads} KV heads)",
        f"nodes: {layout.nodes_total} x {layout.gpus_per_node} GPUs = training {layout.train_nodes}"
        + (f" + generation {layout.generation.nodes}" if layout.generation and layout.generation.nodes else "")
        + (f" + judge {layout.judge.nodes}" if layout.judge else ""),
        f"policy: TP {p.tp} x PP {p.pp} x CP {p.cp} x DP {p.dp} = {p.world} GPUs, sequence parallel "
        f"{'on' if p.sequence_parallel else 'off'}",
    ]
    g = layout.generation
    if g is not None:
        lines.append(f"vLLM: {g.precision}, TP {g.tp} x PP {g.pp}, {g.engines} engine(s) on {g.gpus} GPUs, "
                     f"{'colocated' if g.colocated else 'dedicated nodes'}, "
                     f"gpu_memory_utilization {g.gpu_memory_utilization}")
    t = layout.teacher
    if t is not None:
        lines.append(f"teacher: {t.model.name}, TP {t.tp} x PP {t.pp} x CP {t.cp} x DP {t.dp}, colocated "
                     "(time-shared with the student)")
    c = layout.critic
    if c is not None:
        lines.append(f"critic (value model): {c.model.name}, TP {c.tp} x PP {c.pp} x CP {c.cp} x DP {c.dp}, "
                     f"own optimizer; one worker on each of the {c.world} training GPUs, trained while the policy "
                     "and vLLM are offloaded")
    processes = colocated_processes(layout)
    if len(processes) > 1:
        lines.append(f"on each training GPU: {' + '.join(processes)} ({len(processes)} worker processes, "
                     f"1/{len(processes)} GPU each in Ray)")
    j = layout.judge
    if j is not None:
        lines.append(f"judge: {j.model.name}, {j.servers} vLLM server(s) of TP {j.tp} on {j.nodes} node(s)")
    return lines


def format_report(report: PlanReport, name: str = "") -> str:
    layout = report.layout
    lines = [f"plan: {name or layout.name}  ({report.gpu_mem_gib:g} GiB per GPU)"]
    lines += ["  " + s for s in describe_layout(layout)]
    lines.append("")
    width = max(len(t.label) for t in report.terms) + 2
    lines.append(f"  {'phase':<11}{'term':<{width}}{'GiB/GPU':>9}")
    lines.append(f"  {'-' * 11}{'-' * width}{'-' * 9}")
    for phase in report.phases:
        for t in (x for x in report.terms if x.phase == phase):
            lines.append(f"  {phase:<11}{t.label:<{width}}{t.gib:>9.1f}")
        lines.append(f"  {'':<11}{'= ' + phase + ' total':<{width}}{report.phase_total(phase):>9.1f}")
    lines.append("")
    top = report.largest_term
    lines.append(f"  peak per GPU: {report.peak_gib:.1f} GiB of {report.gpu_mem_gib:g} ({report.peak_phase} phase); "
                 f"largest term: {top.label} ({top.gib:.1f} GiB)")
    for phase in (p for p in report.phases if p not in (report.peak_phase, "judge")):
        biggest = max((t for t in report.terms if t.phase == phase), key=lambda t: t.gib)
        lines.append(f"  {phase} phase: {report.phase_total(phase):.1f} GiB; largest term: {biggest.label} "
                     f"({biggest.gib:.1f} GiB)")
    lines += [f"  note: {note}" for note in report.notes]
    if report.issues:
        lines.append("")
        lines.append(f"  CANNOT RUN ({len(report.issues)} problem(s)):")
        lines += [f"    - {issue}" for issue in report.issues]
    else:
        lines.append("  OK: layout valid and every phase fits")
    return "\n".join(lines)
