"""Stage I -> Stage II on NeMo-RL (docs/DESIGN.md §8): export a run's final Megatron policy checkpoint as a
Hugging Face model, the ``nemo.policy.model_name`` Stage II starts from (recipes/exprl_stage2_qwen3_4b.yaml reads
it from ``EXPRL_STAGE1_MODEL``). It calls NeMo-RL's ``export_model_from_megatron`` (what NeMo-RL's
examples/converters/convert_megatron_to_hf.py calls) with the model and tokenizer named in the run's own
config.yaml. Needs the NeMo-RL container; not exercised on CPU (a thin seam: checkpoint lookup and arguments).

    python -m rise_nemo.backends.nemo.export RUN_DIR OUT_DIR
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml


def export_arguments(run_dir: str | Path, out_dir: str | Path) -> dict[str, Any]:
    """The arguments of ``export_model_from_megatron`` for ``run_dir``'s latest complete checkpoint."""
    from rise_nemo.errors import UserError
    from rise_nemo.orchestration import checkpoint as ckpt

    run_dir = Path(run_dir)
    cfg_path = run_dir / "config.yaml"
    if not cfg_path.is_file():
        raise UserError(f"{run_dir}: no config.yaml (not a run directory)")
    policy = (yaml.safe_load(cfg_path.read_text()).get("nemo") or {}).get("policy") or {}
    if "model_name" not in policy:
        raise UserError(f"{cfg_path}: no nemo.policy.model_name (not a NeMo-RL run)")
    latest = ckpt.latest_checkpoint(run_dir)
    if latest is None:
        raise UserError(f"{run_dir}: no complete checkpoint to export")
    return {"hf_model_name": str(policy["model_name"]), "input_path": str(latest / "policy" / "weights"),
            "output_path": str(out_dir), "hf_tokenizer_path": str((policy.get("tokenizer") or {}).get("name",
                                                                                                   policy["model_name"])),
            "hf_overrides": policy.get("hf_overrides") or {}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="export a NeMo-RL run's final policy as a Hugging Face model")
    p.add_argument("run_dir")
    p.add_argument("out_dir")
    args = p.parse_args(argv)
    if (Path(args.out_dir) / "config.json").is_file():
        print(f"{args.out_dir}: already exported")
        return 0
    kwargs = export_arguments(args.run_dir, args.out_dir)
    from nemo_rl.models.megatron.community_import import export_model_from_megatron

    export_model_from_megatron(**kwargs)
    print(f"exported {kwargs['input_path']} -> {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
