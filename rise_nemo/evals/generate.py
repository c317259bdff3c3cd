"""`rise-nemo eval --suite NAME MODEL`: sample responses for a suite's prompts, then score them.

MODEL is one of
- a run directory (``config.yaml`` inside): the recipe's backend and its latest complete checkpoint (or
  ``--checkpoint``); a ``backend: nemo`` recipe generates with NeMo-RL's vLLM generation (data-parallel over
  the allocation, as in training). That path is a thin seam over ``rise_nemo.backends.build_backend`` and is
  NOT executed on this project's CPU test machines; the local path is.
- a Hugging Face model directory (``config.json`` inside): the local backend (transformers, one process)
  with ``local.model_path`` = MODEL; ``key=value`` overrides go to the ``local:`` block
  (``local.device=cuda``, ``local.dtype=bfloat16``, ...).

Responses go to ``<out>/<suite>.responses.jsonl`` (the format ``rise-nemo score`` reads) as they are made, one
batch of prompts at a time with a progress line; a rerun keeps the problems already complete (resume) and
samples only the rest. The same sampling settings are recorded in the result.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rise_nemo.errors import UserError
from rise_nemo.evals.base import EvalItem, read_jsonl_rows


def load_generator(model: str, checkpoint: str | None, overrides: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """(generator, description) for MODEL (module docstring)."""
    path = Path(model)
    if (path / "config.yaml").is_file():
        return _run_dir_generator(path, checkpoint, overrides)
    if (path / "config.json").is_file():
        if checkpoint is not None:
            raise UserError(f"--checkpoint: {model} is a Hugging Face model directory, not a run directory")
        from rise_nemo.backends.local import build, parse_local_config
        from rise_nemo.errors import require_extra

        require_extra("local", "transformers", what="generating with a Hugging Face model")
        local: dict[str, Any] = {"model_path": str(path)}
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep or not key.startswith("local."):
                raise UserError(f"override {item!r}: with a model directory only local.KEY=VALUE overrides apply")
            import yaml

            local[key.removeprefix("local.")] = yaml.safe_load(value)
        try:
            _, generator = build(parse_local_config(local))
        except ValueError as exc:
            raise UserError(str(exc)) from None
        return generator, {"model": str(path), "backend": "local"}
    raise UserError(f"{model}: neither a run directory (config.yaml) nor a Hugging Face model directory (config.json)")


def _run_dir_generator(run_dir: Path, checkpoint: str | None, overrides: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    from rise_nemo.config import load_config
    from rise_nemo.loop.run import load_eval_model

    env_sources: dict[str, str] = {}
    cfg = load_config(run_dir / "config.yaml", list(overrides), env_sources=env_sources)
    model = load_eval_model(cfg, run_dir, checkpoint, env_sources)  # the same model `rise-nemo eval` evaluates
    return model.generator, {"model": str(run_dir), "backend": str(cfg.backend),
                             "checkpoint": str(model.checkpoint) if model.checkpoint else None, "step": model.step}


def generate_responses(generator: Any, items: Sequence[EvalItem], samples: int, params: Any, out: Path,
                       batch: int = 8, progress: Callable[[str], None] | None = None) -> dict[int, list[str]]:
    """Sample ``samples`` responses per item into ``out`` (appending; complete items already there are
    kept). Returns ``{index: [response, ...]}``."""
    done: dict[int, list[str]] = {}
    if out.is_file():
        for _where, row in read_jsonl_rows(out):
            done.setdefault(int(row["index"]), []).append(row["response"])
        done = {i: rs[:samples] for i, rs in done.items() if len(rs) >= samples}
        _rewrite(out, done)  # drop the incomplete items' rows: they are sampled again
    todo = [it for it in items if it.index not in done]
    if progress is not None and done:
        progress(f"resuming: {len(done)} of {len(items)} problems already sampled in {out}")
    for start in range(0, len(todo), batch):
        chunk = todo[start:start + batch]
        rollouts = generator.generate([list(it.messages) for it in chunk], samples, params)
        with out.open("a", encoding="utf-8") as fh:
            for it, rows in zip(chunk, rollouts):
                done[it.index] = [r.response_text for r in rows]
                for text in done[it.index]:
                    fh.write(json.dumps({"index": it.index, "response": text}, ensure_ascii=False) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        if progress is not None:
            progress(f"generated {len(done)}/{len(items)} problems x {samples} samples")
    return done


def _rewrite(out: Path, done: dict[int, list[str]]) -> None:
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text("".join(json.dumps({"index": i, "response": r}, ensure_ascii=False) + "\n"
                           for i in sorted(done) for r in done[i]), encoding="utf-8")
    os.replace(tmp, out)
