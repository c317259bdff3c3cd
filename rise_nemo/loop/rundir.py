"""Run-directory safety: one trainer per directory (a lock), and resumes only under the same config.

- ``RunDirLock``: an exclusive ``flock`` on ``<run dir>/.lock``, taken before any model is built and held
  for the whole training. A second ``rise-nemo train`` on the same directory (a double ``sbatch``, an
  overlapping requeue) fails at once with a ``UserError``; the kernel drops the lock when the holder
  dies, so a requeue after a crash never finds a stale lock.
- ``check_resume``: a run directory that already holds a ``config.yaml`` may only be resumed with the
  same resolved config, apart from ``RESUME_SAFE_KEYS`` (how long to train and how to log). Any other
  difference is refused, naming every changed key with its old and new value; ``allow_changes=True``
  (``rise-nemo train --allow-config-change``) accepts it and the change is recorded.
- ``write_config``: ``config.yaml`` always holds the config the run continues with; the version it
  replaces is kept as ``config_history/config.<n>.yaml`` and every change is appended to
  ``config_history/changes.jsonl`` (step, key, old, new) — nothing is ever overwritten unrecorded.

Nothing in this module writes before its checks have passed.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from rise_nemo.errors import UserError

LOCK_FILE = ".lock"
CONFIG_FILE = "config.yaml"
HISTORY_DIR = "config_history"
# Keys that may change between a run and its resume without changing what is trained: the step budget,
# checkpoint cadence and logging. (``train.steps`` lets a finished run continue.)
RESUME_SAFE_KEYS = (
    "train.steps", "train.checkpoint_every", "train.keep_checkpoints", "train.progress", "train.tensorboard",
    "train.wandb", "train.wandb_project", "train.log_samples", "eval.every", "eval.at_start", "run.dir", "run.name",
)  # fmt: skip


def check_run_dir_path(run_dir: Path) -> None:
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"run directory {run_dir} exists and is not a directory (--run-dir / run.dir)")


class RunDirLock:
    """Exclusive lock of a run directory (creates the directory). Use as a context manager or
    ``acquire()`` / ``release()``."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self._fh: Any = None

    @property
    def held(self) -> bool:
        return self._fh is not None

    def acquire(self) -> RunDirLock:
        if self._fh is not None:
            return self
        check_run_dir_path(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.run_dir / LOCK_FILE, "a+")
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            fh.close()
            raise UserError(
                f"run directory {self.run_dir} is in use by {holder}; one training per run directory "
                f"(wait for it to finish, or use another --run-dir)"
            ) from None
        fh.seek(0)
        fh.truncate()
        job = os.environ.get("SLURM_JOB_ID")
        fh.write(f"pid {os.getpid()} on {os.uname().nodename}" + (f" (Slurm job {job})" if job else "") + "\n")
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh.fileno(), fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def __enter__(self) -> RunDirLock:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, Mapping) and tree:
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): tree}


def _plain(cfg: Any) -> dict[str, Any]:
    from rise_nemo.config import redact_secrets

    return redact_secrets(cfg)  # the same view config.yaml holds (secrets compare as redacted)


def config_changes(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, old value, new value) for every leaf that differs, sorted by key."""
    a, b = _flatten(old), _flatten(new)
    missing = object()
    out = []
    for key in sorted(set(a) | set(b)):
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            out.append((key, None if va is missing else va, None if vb is missing else vb))
    return out


def _is_safe(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in RESUME_SAFE_KEYS)


def read_run_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / CONFIG_FILE
    if not path.is_file():
        return None
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not readable YAML ({exc}); move it away to start the run afresh") from None
    return data if isinstance(data, dict) else None


def check_resume(run_dir: Path, cfg: Any, allow_changes: bool = False) -> list[tuple[str, Any, Any]]:
    """Refuse (``UserError``) resuming ``run_dir`` under a config that differs in anything but
    ``RESUME_SAFE_KEYS`` unless ``allow_changes``. Returns every change (safe ones included)."""
    old = read_run_config(run_dir)
    if old is None:
        return []
    changes = config_changes(old, _plain(cfg))
    if old.get("method") != str(cfg.method):
        raise UserError(
            f"{run_dir / CONFIG_FILE}: this run trained method {old.get('method')!r}, the config says "
            f"{cfg.method!r}; a method cannot change on resume (use another run directory)"
        )
    unsafe = [c for c in changes if not _is_safe(c[0])]
    if unsafe and not allow_changes:
        listed = "; ".join(f"{k}: {o!r} -> {n!r}" for k, o, n in unsafe)
        raise UserError(
            f"{run_dir / CONFIG_FILE}: resuming with a changed config: {listed} (only "
            f"{', '.join(RESUME_SAFE_KEYS[:3])}, logging and eval cadence may change; pass "
            f"--allow-config-change to accept and record it, or use another run directory)"
        )
    return changes


def write_config(run_dir: Path, cfg: Any, step: int) -> None:
    """Write ``config.yaml``; a different earlier version goes to ``config_history/`` first."""
    from rise_nemo.config import to_yaml

    path = run_dir / CONFIG_FILE
    text = to_yaml(cfg)
    if path.is_file():
        old_text = path.read_text()
        if old_text == text:
            return
        old = yaml.safe_load(old_text) or {}
        history = run_dir / HISTORY_DIR
        history.mkdir(exist_ok=True)
        n = len(list(history.glob("config.*.yaml")))
        (history / f"config.{n}.yaml").write_text(old_text)
        with open(history / "changes.jsonl", "a") as fh:
            for key, before, after in config_changes(old, yaml.safe_load(text) or {}):
                fh.write(json.dumps({"from_step": step, "key": key, "old": before, "new": after,
                                     "previous": f"{HISTORY_DIR}/config.{n}.yaml"}, default=str) + "\n")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
