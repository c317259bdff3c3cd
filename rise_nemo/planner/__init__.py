"""Recipe planner for NeMo-RL runs: parallel-layout checks and a per-GPU memory estimate (no torch).

``rise-nemo plan RECIPE`` (rise_nemo.commands.plan) prints the table; ``plan_recipe`` is the API.
"""

from rise_nemo.planner.layout import PlanIssue
from rise_nemo.planner.models import QWEN3, ModelShape, ModelShapeError, from_hf_config, resolve_model
from rise_nemo.planner.report import DEFAULT_GPU_MEM_GIB, PlanReport, format_report, plan_recipe
from rise_nemo.recipe_keys import RecipeKeyError

__all__ = [
    "DEFAULT_GPU_MEM_GIB",
    "QWEN3",
    "ModelShape",
    "ModelShapeError",
    "PlanIssue",
    "PlanReport",
    "RecipeKeyError",
    "format_report",
    "from_hf_config",
    "plan_recipe",
    "resolve_model",
]
