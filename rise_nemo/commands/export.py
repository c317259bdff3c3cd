"""`rise-nemo export RUN_DIR OUT_DIR`: a NeMo-RL run's final policy as a Hugging Face model (ExpRL Stage I ->
Stage II, docs/DESIGN.md §8; rise_nemo.backends.nemo.export). Skipped when OUT_DIR already holds one."""

from __future__ import annotations

import argparse
from pathlib import Path

HELP = "export a NeMo-RL run's latest policy checkpoint as a Hugging Face model"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", help="a NeMo-RL run directory (config.yaml + checkpoints/)")
    parser.add_argument("out_dir", help="where the Hugging Face model goes")


def export_arguments(run_dir: str | Path, out_dir: str | Path) -> dict:
    """``rise_nemo.backends.nemo.export.export_arguments`` for ``run_dir``'s latest complete checkpoint."""
    from rise_nemo.backends.nemo.export import export_arguments as nemo_export_arguments
    from rise_nemo.errors import UserError
    from rise_nemo.loop.checkpoint import latest_checkpoint

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise UserError(f"{run_dir}: no config.yaml (not a run directory)")
    latest = latest_checkpoint(run_dir)
    if latest is None:
        raise UserError(f"{run_dir}: no complete checkpoint to export")
    return nemo_export_arguments(run_dir / "config.yaml", latest, out_dir)


def run(args: argparse.Namespace) -> int:
    from rise_nemo.backends.nemo.export import export

    if (Path(args.out_dir) / "config.json").is_file():
        print(f"{args.out_dir}: already exported")
        return 0
    arguments = export_arguments(args.run_dir, args.out_dir)
    export(arguments)
    print(f"exported {arguments['input_path']} -> {args.out_dir}")
    return 0
