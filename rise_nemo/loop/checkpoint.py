"""Crash-safe checkpoints in a run directory (docs/CONTRACTS.md "Run directory").

Layout::

    checkpoints/step_000010/policy/       weights + optimiser, written by the policy (see below)
    checkpoints/step_000010/critic/       value model + its optimiser (PPO-family methods only)
    checkpoints/step_000010/trainer.pt    step, RNG states, data position, schedule state
    checkpoints/step_000010/COMPLETE      written last: a directory without it is never loaded
    checkpoints/latest                    text file naming the newest complete checkpoint

A checkpoint is written into a hidden temporary directory and renamed into place only when complete,
and ``latest`` is replaced atomically (``os.replace``), so a kill at any moment leaves the previous
checkpoint intact and ``latest`` pointing at a complete one. What goes into ``policy/`` and ``critic/`` is
the backend's business: the ``save_checkpoint(dir)`` / ``load_checkpoint(dir)`` hooks of
``interfaces.Policy`` / ``interfaces.Critic`` (local: ``state.pt``; nemo: NeMo-RL's sharded
``weights/`` + ``optimizer/``).
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from rise_nemo.errors import UserError
from rise_nemo.interfaces import CheckpointLayout, Critic, Policy, StagedPolicy

CHECKPOINTS = "checkpoints"
LATEST = "latest"
COMPLETE = "COMPLETE"
_STEP_RE = re.compile(r"^step_(\d{6,})$")


def step_dir_name(step: int) -> str:
    return f"step_{step:06d}"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(run_dir: str | Path, step: int, policy: Policy, trainer_state: dict[str, Any],
                    critic: Critic | None = None) -> Path:
    """Write checkpoint ``step`` completely, then publish it as ``latest``. Returns its directory.
    A critic (value model of the PPO-family methods) is saved into ``critic/`` (weights + optimiser)."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    policy.save_checkpoint(tmp / "policy")
    if critic is not None:
        critic.save_checkpoint(tmp / "critic")
    torch.save(trainer_state, tmp / "trainer.pt")
    (tmp / COMPLETE).write_text(f"{step}\n")
    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): replace the old copy
        shutil.rmtree(final)
    os.rename(tmp, final)
    _fsync_dir(root)
    _write_atomic_text(root / LATEST, final.name + "\n")
    return final


def is_complete(path: Path) -> bool:
    return (path / COMPLETE).is_file() and (path / "trainer.pt").is_file()


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints, oldest first."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _STEP_RE.match(child.name)
        if match and child.is_dir() and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The checkpoint ``latest`` names if it is complete, else the newest complete one, else None."""
    root = Path(run_dir) / CHECKPOINTS
    pointer = root / LATEST
    if pointer.is_file():
        candidate = root / pointer.read_text().strip()
        if candidate.is_dir() and is_complete(candidate):
            return candidate
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def load_checkpoint(path: str | Path, policy: Policy, critic: Critic | None = None) -> dict[str, Any]:
    """Restore the policy (and the critic, when given) in place from checkpoint ``path``; returns the
    trainer state."""
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(f"{path}: not a complete checkpoint (missing {COMPLETE} or trainer.pt)")
    policy.load_checkpoint(path / "policy")
    if critic is not None:
        try:
            critic.load_checkpoint(path / "critic")
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"{path}: the method trains a critic but the checkpoint has none ({exc})") from None
    return torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)


def prune_checkpoints(run_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest complete checkpoints (0 keeps all) and stale temp dirs."""
    root = Path(run_dir) / CHECKPOINTS
    removed: list[Path] = []
    if not root.is_dir():
        return removed
    for child in root.iterdir():
        if child.name.startswith(".tmp-") and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    if keep <= 0:
        return removed
    latest = latest_checkpoint(run_dir)
    for _, path in list_checkpoints(run_dir)[:-keep]:
        if path != latest:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


RISE_NEMO_LAYOUT = CheckpointLayout(
    root=CHECKPOINTS, dir_name=step_dir_name, list=list_checkpoints, latest=latest_checkpoint,
    is_complete=is_complete, load=lambda path, policy: int(load_checkpoint(path, policy)["step"]),
)


def checkpoint_layout(cfg: Any) -> CheckpointLayout:
    """Where a run of this recipe keeps its checkpoints: rise_nemo's own, except the nemo backend's
    on-policy distillation, which NeMo-RL's loop checkpoints (rise_nemo.backends.nemo.checkpoints)."""
    if cfg.backend == "nemo":
        from rise_nemo.backends.nemo import plain_recipe
        from rise_nemo.backends.nemo.checkpoints import checkpoint_layout as nemo_layout

        return nemo_layout(plain_recipe(cfg)) or RISE_NEMO_LAYOUT
    return RISE_NEMO_LAYOUT


def resolve_checkpoint(run_dir: Path, name: str | None, layout: CheckpointLayout | None = None) -> Path | None:
    """``--checkpoint``: a directory, or a name under the layout's directory (rise_nemo's
    ``checkpoints/``: ``step_000010``, ``step_10``, ``10``; an OPD run's ``nemo_rl_checkpoints/``:
    ``step_10``, ``10``); None = the latest complete one, the one a resume starts from. An unknown name is
    a ``UserError`` listing what exists."""
    layout = layout or RISE_NEMO_LAYOUT
    if name is None:
        return layout.latest(run_dir)
    given = Path(name)
    if given.is_dir():
        candidate = given
    else:
        digits = name.removeprefix("step_")
        short = layout.dir_name(int(digits)) if digits.isdigit() else name
        candidate = run_dir / layout.root / short
    if not layout.is_complete(candidate):
        known = ", ".join(p.name for _, p in layout.list(run_dir)) or "none"
        raise UserError(f"--checkpoint {name}: no complete checkpoint at {candidate} (complete checkpoints "
                        f"in {run_dir / layout.root}: {known})")
    return candidate


def init_policy_from(policy: Any, checkpoint: Path) -> None:
    """Load only the policy weights of ``checkpoint`` (the previous stage's final one): a fresh optimiser, and
    the KL reference (if any) becomes these weights (the local policy's ``begin_stage``). Local backend (its
    ``policy/state.pt``); NeMo-RL stages start from a converted checkpoint named in their recipe
    (docs/DESIGN.md §8)."""
    if not isinstance(policy, StagedPolicy):
        raise UserError(f"init: previous needs the local backend's checkpoint format ({checkpoint}/policy); on "
                        "NeMo-RL point the next stage's nemo.policy.model_name at Stage I's converted checkpoint")
    try:
        policy.begin_stage(checkpoint / "policy")
    except FileNotFoundError as exc:
        raise UserError(f"init: previous: {exc}") from None
