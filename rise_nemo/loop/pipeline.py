"""Multi-stage runs: ExpRL's Stage I (mid-training) then Stage II (sparse GRPO) from Stage I's final
checkpoint, one command (``rise-nemo pipeline FILE``; docs/DESIGN.md §8).

A pipeline file names the stages; each stage is an ordinary recipe with overrides and its own run
directory ``<pipeline.dir>/<stage name>``::

    pipeline:
      name: exprl_pipeline_tiny_cpu
      dir: runs/exprl_pipeline_tiny_cpu
    stages:
      - name: stage1
        recipe: exprl_process_chain_tiny_cpu.yaml   # relative to this file
        overrides: {train.steps: 20}
      - name: stage2
        recipe: grpo_chain_tiny_cpu.yaml
        init: previous                              # the previous stage's final checkpoint (weights only)

Resume: a stage whose run directory holds a ``summary.json`` for all its steps is done and skipped; any
other stage runs through ``build_trainer``, which resumes from its own latest checkpoint. A stage that
starts fresh with ``init: previous`` loads the policy WEIGHTS of the previous stage's final checkpoint
(a fresh optimiser and, for a KL term, a fresh reference = those weights) instead of the warm start. A
stop signal ends the pipeline after the current stage's checkpoint; the next call continues there.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rise_nemo.errors import UserError

log = logging.getLogger("rise_nemo.pipeline")

INIT_CHOICES = ("warm_start", "previous")


@dataclass(frozen=True)
class Stage:
    name: str
    recipe: Path
    overrides: tuple[str, ...] = ()
    init: str = "warm_start"


@dataclass(frozen=True)
class Pipeline:
    name: str
    dir: Path
    stages: tuple[Stage, ...]
    source: Path = field(default=Path("."))

    def stage_dir(self, stage: Stage) -> Path:
        return self.dir / stage.name


def load_pipeline(path: str | Path, run_dir: str | Path | None = None) -> Pipeline:
    """Read and check a pipeline file; every error is a one-line ``UserError`` naming the file and key."""
    from rise_nemo.config.recipes import resolve_recipe

    path = resolve_recipe(path, what="pipeline")  # a path, or a name like the recipes': exprl_pipeline_tiny_cpu
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("stages"), list) or not data["stages"]:
        raise UserError(f"{path}: key 'stages' must be a non-empty list of stages")
    unknown = sorted(set(data) - {"pipeline", "stages"})
    if unknown:
        raise UserError(f"{path}: unknown top-level key(s) {unknown}; expected pipeline, stages")
    head = data.get("pipeline") or {}
    if not isinstance(head, Mapping):
        raise UserError(f"{path}: key 'pipeline' must be a mapping (name, dir)")
    name = str(head.get("name", path.stem))
    root = Path(run_dir) if run_dir is not None else Path(str(head.get("dir", f"runs/{name}")))
    stages, seen = [], set()
    for k, raw in enumerate(data["stages"]):
        where = f"{path}: stages[{k}]"
        if not isinstance(raw, Mapping):
            raise UserError(f"{where}: expected a mapping with name, recipe[, overrides, init]")
        bad = sorted(set(raw) - {"name", "recipe", "overrides", "init"})
        if bad:
            raise UserError(f"{where}: unknown key(s) {bad}; expected name, recipe, overrides, init")
        sname = str(raw.get("name") or f"stage{k + 1}")
        if sname in seen or "/" in sname:
            raise UserError(f"{where}.name: {sname!r} must be unique and contain no '/'")
        seen.add(sname)
        if not raw.get("recipe"):
            raise UserError(f"{where}.recipe is required")
        recipe = _stage_recipe(path, str(raw["recipe"]), where)
        ov = raw.get("overrides") or {}
        if isinstance(ov, Mapping):
            overrides = tuple(f"{key}={_yaml_value(v)}" for key, v in ov.items())
        elif isinstance(ov, list):
            overrides = tuple(str(x) for x in ov)
        else:
            raise UserError(f"{where}.overrides: expected a mapping or a list of key=value")
        init = str(raw.get("init", "warm_start"))
        if init not in INIT_CHOICES or (init == "previous" and k == 0):
            raise UserError(f"{where}.init: expected one of {list(INIT_CHOICES)} ('previous' not on the first stage), "
                            f"got {init!r}")
        stages.append(Stage(sname, recipe, overrides, init))
    return Pipeline(name, root, tuple(stages), path)


def _stage_recipe(path: Path, name: str, where: str) -> Path:
    """A stage's recipe: relative to the pipeline file, else by name among the recipes (``./recipes``, the
    shipped ones), so a pipeline file copied elsewhere still finds the shipped stage recipes."""
    from rise_nemo.config.recipes import resolve_recipe

    recipe = (path.parent / name).resolve()
    if recipe.is_file():
        return recipe
    try:
        return resolve_recipe(name).resolve()
    except UserError:
        raise UserError(f"{where}.recipe: file not found: {recipe} (nor a recipe named {name!r})") from None


def _yaml_value(value: Any) -> str:
    return json.dumps(value) if isinstance(value, list | dict) else str(value)


def stage_config(pipeline: Pipeline, stage: Stage, overrides: Sequence[str] = ()) -> Any:
    """The stage's validated recipe: its file, its overrides, the command line's, then its run directory and
    its evaluation stream offset (``eval_stream_offset``). A bad override is a ``UserError`` naming the pipeline
    file and the stage (and whose override it was)."""
    from rise_nemo.config import ConfigError, load_config
    from rise_nemo.config.loader import OVERRIDE_SOURCE

    where = f"{pipeline.source}: stages[{pipeline.stages.index(stage)}] ({stage.name}, recipe {stage.recipe.name})"
    try:
        load_config(stage.recipe, stage.overrides)
    except ConfigError as exc:
        raise UserError(f"{where}: {str(exc).replace(OVERRIDE_SOURCE, 'override', 1)}") from None
    try:
        return load_config(stage.recipe, [*stage.overrides, *overrides, f"run.dir={pipeline.stage_dir(stage)}",
                                          f"run.name={pipeline.name}-{stage.name}",
                                          f"eval.stream_offset={eval_stream_offset(pipeline, stage, overrides)}"])
    except ConfigError as exc:
        raise UserError(f"{where}: {exc}") from None


def eval_stream_offset(pipeline: Pipeline, stage: Stage, overrides: Sequence[str] = ()) -> int:
    """Where ``stage``'s steps continue the evaluation streams (``eval.stream_offset``): 0 for a stage that starts
    from its warm start; for ``init: previous``, the previous stage's offset + its ``train.steps`` (the step of
    the final checkpoint it starts from). Stage I's final evaluation and Stage II's step-0 evaluation of the same
    weights then sample the same stream and agree exactly (with the same ``run.seed``)."""
    from rise_nemo.config import load_config

    offset = 0
    for k, current in enumerate(pipeline.stages):
        if current == stage:
            return offset
        following = pipeline.stages[k + 1] if k + 1 < len(pipeline.stages) else None
        if following is not None and following.init == "previous":
            cfg = load_config(current.recipe, [*current.overrides, *overrides])
            offset += int(cfg.train.steps)
        else:
            offset = 0
    raise ValueError(f"stage {stage.name!r} is not a stage of pipeline {pipeline.name!r}")


def eval_differences(previous: Any, cfg: Any) -> list[str]:
    """What makes a stage's step-0 evaluation differ from the previous stage's final one of the same weights,
    besides the stream (``eval_stream_offset`` aligns that): its sampling parameters, samples per prompt, the
    held-out set and the seed. Empty when the two evaluations are the same computation."""
    from rise_nemo.steps.rollouts import eval_sampling_params

    a = eval_sampling_params(previous, int(previous.train.steps))
    b = eval_sampling_params(cfg, 0)
    out = [f"{name} {getattr(a, name)} -> {getattr(b, name)}" for name in ("temperature", "top_p", "max_new_tokens")
           if getattr(a, name) != getattr(b, name)]
    for key in ("eval.samples_per_prompt", "eval.max_prompts", "run.seed", "data.source", "data.eval_path",
                "data.task"):
        x, y = _get(previous, key), _get(cfg, key)
        if x != y:
            out.append(f"{key} {x} -> {y}")
    return out


def _get(cfg: Any, dotted: str) -> Any:
    from omegaconf import OmegaConf

    return OmegaConf.select(cfg, dotted)


def stage_done(run_dir: Path, steps: int) -> bool:
    summary = run_dir / "summary.json"
    if not summary.is_file():
        return False
    try:
        return int(json.loads(summary.read_text()).get("steps", -1)) >= steps
    except (ValueError, TypeError):
        return False


def final_checkpoint(run_dir: Path) -> Path:
    from rise_nemo.loop import checkpoint as ckpt

    path = ckpt.latest_checkpoint(run_dir)
    if path is None:
        raise UserError(f"{run_dir}: the previous stage finished without a checkpoint to start from")
    return path


def run_pipeline(pipeline: Pipeline, overrides: Sequence[str] = (), stop_after: int | None = None) -> int:
    """Run (or resume) every stage in order (module docstring). Returns 0, also after a stop signal."""
    from rise_nemo.loop.run import check_run

    configs = [stage_config(pipeline, stage, overrides) for stage in pipeline.stages]  # all checked first
    for cfg in configs:  # and what every stage's method needs, before the first stage trains
        check_run(cfg)
    created = not pipeline.dir.exists()
    pipeline.dir.mkdir(parents=True, exist_ok=True)
    try:
        return _run_stages(pipeline, configs, stop_after)
    except BaseException:
        if created and pipeline.dir.is_dir() and not any(pipeline.dir.iterdir()):
            pipeline.dir.rmdir()  # a refused pipeline leaves nothing behind
        raise


def _run_stages(pipeline: Pipeline, configs: Sequence[Any], stop_after: int | None) -> int:
    from rise_nemo.loop.run import build_trainer

    previous: Path | None = None
    previous_cfg: Any = None
    for stage, cfg in zip(pipeline.stages, configs):
        run_dir = pipeline.stage_dir(stage)
        if stage.init == "previous" and previous_cfg is not None and cfg.eval.at_start:
            diff = eval_differences(previous_cfg, cfg)
            if diff:
                log.warning("pipeline %s: stage %s evaluates its starting weights differently from the previous "
                            "stage's final evaluation (%s), so the two will not agree", pipeline.name, stage.name,
                            "; ".join(diff))
        previous_cfg = cfg
        if stage_done(run_dir, int(cfg.train.steps)):
            log.info("pipeline %s: stage %s already complete (%s)", pipeline.name, stage.name, run_dir)
            previous = run_dir
            continue
        init = final_checkpoint(previous) if stage.init == "previous" and previous is not None else None
        log.info("pipeline %s: stage %s -> %s%s", pipeline.name, stage.name, run_dir,
                 f" (from {init})" if init else "")
        trainer = build_trainer(cfg, run_dir=run_dir, stop_after=stop_after, init_from=init)
        trainer.run()
        if trainer.stopped_by is not None or not stage_done(run_dir, int(cfg.train.steps)):
            log.info("pipeline %s: stopped in stage %s; run the same command again to continue", pipeline.name,
                     stage.name)
            return 0
        previous = run_dir
    _write_index(pipeline)
    return 0


def _write_index(pipeline: Pipeline) -> None:
    index = {"pipeline": pipeline.name, "stages": [{"name": s.name, "recipe": s.recipe.name, "init": s.init}
                                                   for s in pipeline.stages]}
    (pipeline.dir / "pipeline.json").write_text(json.dumps(index, indent=1))


def _stage_steps(run_dir: Path) -> int:
    """Steps a stage trained: its summary's ``steps``, else the last step in its metrics (0 without either)."""
    try:
        return int(json.loads((run_dir / "summary.json").read_text())["steps"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        lines = [ln for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]
        return int(json.loads(lines[-1])["step"]) if lines else 0
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def stage_position(run_dir: str | Path) -> dict[str, Any] | None:
    """Where a run directory sits in its pipeline (its parent holds ``pipeline.json`` naming it as a stage):
    ``pipeline`` (the pipeline directory), ``stage_index`` and ``step_offset`` (the steps of the stages before
    it, so reports draw the stages on one timeline); None for a run outside a pipeline."""
    run_dir = Path(run_dir)
    index = run_dir.parent / "pipeline.json"
    try:
        names = [str(s["name"]) for s in json.loads(index.read_text())["stages"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if run_dir.name not in names:
        return None
    k = names.index(run_dir.name)
    return {"pipeline": run_dir.parent, "stage_index": k,
            "step_offset": sum(_stage_steps(run_dir.parent / n) for n in names[:k])}


def expand_pipeline_dirs(run_dirs: Sequence[str | Path]) -> list[str]:
    """Run directories with every pipeline directory (one holding ``pipeline.json``) replaced by its stages'."""
    out: list[str] = []
    for d in run_dirs:
        index = Path(d) / "pipeline.json"
        if index.is_file():
            out.extend(str(Path(d) / s["name"]) for s in json.loads(index.read_text())["stages"])
        else:
            out.append(str(d))
    return out
