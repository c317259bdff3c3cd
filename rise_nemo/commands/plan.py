"""`rise-nemo plan RECIPE`: check a NeMo-RL recipe's parallel layout and estimate per-GPU memory.

Exit codes: 0 the recipe fits; 1 it cannot run (each reason printed with the recipe key to change);
2 the recipe itself cannot be read (missing file, bad key, unknown model). Imports no torch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HELP = "check a NeMo-RL recipe's parallel layout and per-GPU memory (no GPU needed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="recipe YAML, or a name under recipes/ (e.g. rise_14b)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, as for `train` (key=value, ++key=value)")
    parser.add_argument("--nodes", type=int, default=None,
                        help="total nodes (training + dedicated generation + judge); default: the recipe's nemo.plan.nodes")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="default: the recipe's nemo.cluster.gpus_per_node")
    parser.add_argument("--gpu-mem-gib", type=float, default=141.0, help="GPU memory in GiB (H200: 141)")


def resolve_recipe_path(recipe: str) -> Path:
    p = Path(recipe)
    if p.exists():
        return p
    for base in (Path.cwd() / "recipes", Path(__file__).resolve().parents[2] / "recipes"):
        for candidate in (base / recipe, base / f"{recipe}.yaml"):
            if candidate.exists():
                return candidate
    raise FileNotFoundError(f"recipe {recipe!r} not found (neither a file nor a name under recipes/)")


def load_tree(path: Path, overrides: list[str]) -> dict:
    from omegaconf import OmegaConf

    from rise_nemo.config.loader import load_config

    return OmegaConf.to_container(load_config(path, overrides), resolve=True)


def run(args: argparse.Namespace) -> int:
    from rise_nemo.planner import ModelShapeError, RecipeKeyError, format_report, plan_recipe

    try:
        path = resolve_recipe_path(args.recipe)
        tree = load_tree(path, list(args.overrides))
        report = plan_recipe(tree, nodes=args.nodes, gpus_per_node=args.gpus_per_node, gpu_mem_gib=args.gpu_mem_gib)
    except (FileNotFoundError, RecipeKeyError, ModelShapeError, ValueError) as exc:
        # ValueError covers rise_nemo.config.ConfigError (bad key/type, naming the file).
        print(f"rise-nemo plan: {args.recipe}: {exc}", file=sys.stderr)
        return 2
    print(format_report(report, path.stem))
    return 0 if report.ok else 1
