"""Crash-safe checkpoints in a run directory (docs/CONTRACTS.md "Run directory").

Layout::

    checkpoints/step_000010/policy.pt     weights + optimiser (or the policy's own files, see below)
    checkpoints/step_000010/critic.pt     value model + its optimiser (PPO-family methods only)
    checkpoints/step_000010/trainer.pt    step, RNG states, data position, schedule state
    checkpoints/step_000010/COMPLETE      written last: a directory without it is never loaded
    checkpoints/latest                    text file naming the newest complete checkpoint

A checkpoint is written into a hidden temporary directory and renamed into place only when complete,
and ``latest`` is replaced atomically (``os.replace``), so a kill at any moment leaves the previous
checkpoint intact and ``latest`` pointing at a complete one. Policies that manage their own (possibly
sharded) files expose ``save_checkpoint(dir)`` / ``load_checkpoint(dir)``; others are saved with
``torch.save(policy.state_dict())``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

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


def save_checkpoint(run_dir: str | Path, step: int, policy: Any, trainer_state: dict[str, Any],
                    critic: Any = None) -> Path:
    """Write checkpoint ``step`` completely, then publish it as ``latest``. Returns its directory.
    A critic (value model of the PPO-family methods) is saved as ``critic.pt`` (weights + optimiser)."""
    root = Path(run_dir) / CHECKPOINTS
    root.mkdir(parents=True, exist_ok=True)
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    if hasattr(policy, "save_checkpoint"):
        policy.save_checkpoint(tmp / "policy")
    else:
        torch.save(policy.state_dict(), tmp / "policy.pt")
    if critic is not None:
        torch.save(critic.state_dict(), tmp / "critic.pt")
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


def load_checkpoint(path: str | Path, policy: Any, critic: Any = None) -> dict[str, Any]:
    """Restore the policy (and the critic, when given) in place from checkpoint ``path``; returns the
    trainer state."""
    path = Path(path)
    if not is_complete(path):
        raise FileNotFoundError(f"{path}: not a complete checkpoint (missing {COMPLETE} or trainer.pt)")
    if hasattr(policy, "load_checkpoint") and (path / "policy").exists():
        policy.load_checkpoint(path / "policy")
    else:
        policy.load_state_dict(torch.load(path / "policy.pt", map_location="cpu", weights_only=False))
    if critic is not None:
        if not (path / "critic.pt").is_file():
            raise FileNotFoundError(f"{path}: the method trains a critic but the checkpoint has no critic.pt")
        critic.load_state_dict(torch.load(path / "critic.pt", map_location="cpu", weights_only=False))
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


@dataclass(frozen=True)
class CheckpointLayout:
    """How a run directory keeps its checkpoints, for commands that pick one (`rise-nemo eval --checkpoint`).

    This module's layout (``RISE_NEMO_LAYOUT``) is every rise_nemo training loop's; a backend whose loop is
    someone else's (NeMo-RL's distillation, rise_nemo.backends.nemo.checkpoints) provides another."""

    root: str  # directory under the run directory
    dir_name: Callable[[int], str]  # step -> checkpoint directory name
    list: Callable[[str | Path], list[tuple[int, Path]]]  # run dir -> complete checkpoints, oldest first
    latest: Callable[[str | Path], Path | None]  # run dir -> the one a resume starts from
    is_complete: Callable[[Path], bool]
    load: Callable[[Path, Any], int]  # (checkpoint, policy) -> its step, policy restored


RISE_NEMO_LAYOUT = CheckpointLayout(
    root=CHECKPOINTS, dir_name=step_dir_name, list=list_checkpoints, latest=latest_checkpoint,
    is_complete=is_complete, load=lambda path, policy: int(load_checkpoint(path, policy)["step"]),
)
