"""Stage I -> Stage II on NeMo-RL (docs/DESIGN.md §8): export a run's final Megatron policy checkpoint as a
Hugging Face model, the ``nemo.policy.model_name`` Stage II starts from (recipes/exprl_stage2_qwen3_4b.yaml reads
it from ``EXPRL_STAGE1_MODEL``). It calls NeMo-RL's ``export_model_from_megatron`` (what NeMo-RL's
examples/converters/convert_megatron_to_hf.py calls) with the model and tokenizer named in the run's own
config.yaml. Needs the NeMo-RL container; not exercised on CPU (a thin seam: arguments only).

    rise-nemo export RUN_DIR OUT_DIR      (rise_nemo.commands.export picks the run's latest checkpoint)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def export_arguments(config_path: str | Path, checkpoint: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """The arguments of ``export_model_from_megatron`` for the policy of ``checkpoint`` (a rise_nemo checkpoint
    directory of the run whose recipe is ``config_path``)."""
    from rise_nemo.errors import UserError

    config_path = Path(config_path)
    policy = (yaml.safe_load(config_path.read_text()).get("nemo") or {}).get("policy") or {}
    if "model_name" not in policy:
        raise UserError(f"{config_path}: no nemo.policy.model_name (not a NeMo-RL run)")
    tokenizer = (policy.get("tokenizer") or {}).get("name", policy["model_name"])
    return {"hf_model_name": str(policy["model_name"]), "input_path": str(Path(checkpoint) / "policy" / "weights"),
            "output_path": str(out_dir), "hf_tokenizer_path": str(tokenizer),
            "hf_overrides": policy.get("hf_overrides") or {}}


def export(arguments: dict[str, Any]) -> None:
    """NeMo-RL's Megatron -> Hugging Face conversion with ``export_arguments``' result (needs NeMo-RL)."""
    from nemo_rl.models.megatron.community_import import export_model_from_megatron

    export_model_from_megatron(**arguments)


__all__ = ["export", "export_arguments"]
