"""`rise-nemo plan RECIPE`: check a NeMo-RL recipe's parallel layout and estimate per-GPU memory.

Exit codes: 0 the recipe fits; 1 it cannot run (each reason printed with the recipe key to change);
2 the recipe itself cannot be read (missing file, bad key, unknown model). Imports no torch.
``rise-nemo train`` runs the same check for a ``backend: nemo`` recipe before anything starts, and the
Slurm launcher runs this command (``--skip-non-nemo``) in its dry run and before it starts any step.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

HELP = "check a NeMo-RL recipe's parallel layout and per-GPU memory (no GPU needed)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe", help="recipe YAML, or a name under recipes/ (e.g. rise_14b)")
    parser.add_argument("overrides", nargs="*", help="recipe overrides, as for `train` (key=value, ++key=value)")
    parser.add_argument("--nodes", type=int, default=None,
                        help="total nodes (training + dedicated generation + judge); default: the recipe's nemo.plan.nodes")
    parser.add_argument("--gpus-per-node", type=int, default=None, help="default: the recipe's nemo.cluster.gpus_per_node")
    parser.add_argument("--gpu-mem-gib", type=float, default=141.0, help="GPU memory in GiB (H200: 141)")
    parser.add_argument("--train-nodes", type=int, default=None,
                        help="training nodes (instead of --nodes; dedicated generation and judge nodes are added "
                             "from the recipe): what slurm/launch.sh gives the driver")
    parser.add_argument("--skip-non-nemo", action="store_true",
                        help="exit 0 with a note for a recipe that is not backend: nemo (used by slurm/launch.sh)")


def resolve_recipe_path(recipe: str) -> Path:
    from rise_nemo.config.recipes import resolve_recipe
    from rise_nemo.errors import UserError

    try:
        return resolve_recipe(recipe)
    except UserError as exc:
        raise FileNotFoundError(str(exc)) from None


def load_tree(path: Path, overrides: list[str]) -> dict:
    from omegaconf import OmegaConf

    from rise_nemo.config.loader import load_config

    return OmegaConf.to_container(load_config(path, overrides), resolve=True)


def refuse_unplannable(cfg: Any) -> None:
    """``UserError`` when the planner rejects a validated ``backend: nemo`` config at the node count its
    ``nemo.cluster.num_nodes`` (as the launcher sets it) implies; used by `rise-nemo train`."""
    from omegaconf import OmegaConf

    from rise_nemo.backends.nemo.config import NemoConfigError, validate_nemo_block
    from rise_nemo.errors import UserError
    from rise_nemo.planner import ModelShapeError, RecipeKeyError, plan_recipe
    from rise_nemo.planner.layout import nodes_from_cluster

    tree = OmegaConf.to_container(cfg, resolve=True)
    try:
        validate_nemo_block(tree)
    except NemoConfigError as exc:
        raise UserError(str(exc)) from None
    try:
        report = plan_recipe(tree, nodes=nodes_from_cluster(tree))
    except (RecipeKeyError, ModelShapeError, ValueError) as exc:
        raise UserError(f"planner: {exc}") from None
    if not report.ok:
        reasons = "; ".join(f"{i.key}: {i.message}" for i in report.issues)
        raise UserError(f"the planner rejects this layout ({reasons}); see `rise-nemo plan`")


def run(args: argparse.Namespace) -> int:
    from rise_nemo.planner import ModelShapeError, RecipeKeyError, format_report, plan_recipe

    try:
        path = resolve_recipe_path(args.recipe)
        tree = load_tree(path, list(args.overrides))
        if args.skip_non_nemo and tree.get("backend") != "nemo":
            print(f"plan: {path.stem}: backend {tree.get('backend')} (not NeMo-RL): no layout to check")
            return 0
        if tree.get("backend") == "nemo":
            from rise_nemo.backends.nemo.config import validate_nemo_block

            validate_nemo_block(tree)  # a refused nemo: key (rise_nemo.backends.nemo.keys) is named, exit 2
        nodes = args.nodes
        if args.train_nodes is not None:
            from rise_nemo.planner.layout import nodes_from_cluster
            from rise_nemo.recipe_keys import get

            nodes = args.train_nodes + nodes_from_cluster(tree) - get(tree, "nemo.cluster.num_nodes", typ=int)
        report = plan_recipe(tree, nodes=nodes, gpus_per_node=args.gpus_per_node, gpu_mem_gib=args.gpu_mem_gib)
    except (FileNotFoundError, RecipeKeyError, ModelShapeError, ValueError) as exc:
        # ValueError covers rise_nemo.config.ConfigError (bad key/type, naming the file). The recipe is named
        # once: not again in front of a message that already names it.
        where = "" if str(args.recipe) in str(exc) else f"{args.recipe}: "
        print(f"rise-nemo plan: {where}{exc}", file=sys.stderr)
        return 2
    print(format_report(report, path.stem))
    return 0 if report.ok else 1
