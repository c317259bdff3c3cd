"""Which checkpoint a nemo-backend policy is built from: one rule for a resumed run and for `rise-nemo eval`.

NeMo-RL loads weights only when a ``Policy`` is created, so the checkpoint must be chosen BEFORE the
backend is built (``build_backend(cfg, checkpoint=...)``), by the same code whether the caller resumes training or
evaluates. A run directory holds one of two layouts:

- rise_nemo's own loop (``nemo.algorithm: grpo``, every RL method): ``<run>/checkpoints/step_000010/``
  with ``policy/{weights,optimizer,tokenizer}`` (written through NeMo-RL's ``Policy.save_checkpoint``),
  ``trainer.pt`` and ``COMPLETE`` (rise_nemo.loop.checkpoint; ``latest`` names the newest).
- on-policy distillation (``nemo.algorithm: distillation``): NeMo-RL's ``distillation_train`` and its
  ``CheckpointManager`` write ``<run>/nemo_rl_checkpoints/step_10/`` (``checkpoint_dir`` is set there by
  ``config.derived_values``) holding ``training_info.json``, ``config.yaml``,
  ``policy/{weights,optimizer,tokenizer}`` and ``train_dataloader.pt`` (algorithms/distillation.py:1003-1029).
  The step in the name is unpadded (``total_steps + 1``). A checkpoint is written as ``tmp_step_N`` and
  renamed when complete (``finalize_checkpoint``, utils/checkpoint.py:239-266); NeMo-RL resumes from the
  ``step_N`` directory with the highest N (``get_latest_checkpoint_path``, utils/checkpoint.py:357-373,
  called by distillation.setup, distillation.py:255-256), ignoring ``tmp_step_*`` / ``old_step_*``.

``NEMO_RL_LAYOUT`` has the shape of rise_nemo's own (``CheckpointLayout``), so `rise-nemo eval --checkpoint` resolves
names, lists and finds the latest the same way on either. No NeMo-RL import here.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rise_nemo.interfaces import CheckpointLayout

NEMO_RL_CHECKPOINTS = "nemo_rl_checkpoints"
_NEMO_RL_STEP = re.compile(r"step_(\d+)")  # NeMo-RL matches names with re.fullmatch(r"step_\d+")


def nemo_rl_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """NeMo-RL's finished checkpoints of a distillation run, oldest first (``step_N`` directories)."""
    root = Path(run_dir) / NEMO_RL_CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), child) for child in root.iterdir()
             if child.is_dir() and (m := _NEMO_RL_STEP.fullmatch(child.name))]
    return sorted(found)


def latest_nemo_rl_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint NeMo-RL's distillation resumes from: the ``step_N`` with the highest N."""
    found = nemo_rl_checkpoints(run_dir)
    return found[-1][1] if found else None


def is_nemo_rl_checkpoint(path: Path) -> bool:
    """A finished NeMo-RL checkpoint with the policy's weights (what eval needs)."""
    return (_NEMO_RL_STEP.fullmatch(path.name) is not None and (path / "training_info.json").is_file()
            and (path / "policy" / "weights").is_dir())


def nemo_rl_step(path: Path) -> int:
    """The step a NeMo-RL checkpoint was saved after: ``total_steps`` in training_info.json (the name's N)."""
    named = int(_NEMO_RL_STEP.fullmatch(path.name).group(1))
    info = path / "training_info.json"
    return int(json.loads(info.read_text()).get("total_steps", named)) if info.is_file() else named


def load_built_policy(path: Path, policy: Any) -> int:
    """The policy was built from ``path`` (NeMo-RL loads weights at creation): check that it was this one
    (``NemoPolicy.load_checkpoint`` raises otherwise) and return the checkpoint's step."""
    policy.load_checkpoint(path / "policy")
    return nemo_rl_step(path)


NEMO_RL_LAYOUT = CheckpointLayout(
    root=NEMO_RL_CHECKPOINTS,
    dir_name=lambda step: f"step_{step}",
    list=nemo_rl_checkpoints,
    latest=latest_nemo_rl_checkpoint,
    is_complete=is_nemo_rl_checkpoint,
    load=load_built_policy,
)


def checkpoint_layout(recipe: Mapping[str, Any]) -> CheckpointLayout | None:
    """Where this recipe's runs keep their policy checkpoints when NeMo-RL's loop writes them (distillation:
    NeMo-RL's manager); None when rise_nemo's own loop does (rise_nemo.loop.checkpoint)."""
    from rise_nemo.backends.nemo.config import NEMO_DISTILLATION, algorithm

    return NEMO_RL_LAYOUT if algorithm(recipe) == NEMO_DISTILLATION else None


def model_dir(checkpoint: str | Path | None, name: str) -> Path | None:
    """``<checkpoint>/<name>`` when it holds NeMo-RL weights (what ``save_checkpoint`` wrote there), else None."""
    if checkpoint is None or not (Path(checkpoint) / name / "weights").exists():
        return None
    return Path(checkpoint) / name


def policy_dir(checkpoint: str | Path | None) -> Path | None:
    """``<checkpoint>/policy`` when it holds weights (both layouts keep the policy there), else None."""
    return model_dir(checkpoint, "policy")
