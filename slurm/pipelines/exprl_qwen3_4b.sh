#!/bin/bash
# ExpRL's two stages on NeMo-RL as two dependent Slurm jobs (docs/DESIGN.md §8); run it on the login node:
#   CONTAINER=/path/nemo-rl.sqsh bash slurm/pipelines/exprl_qwen3_4b.sh
# 1. Stage I  (2 nodes: training + judge): EXPRL_STAGE1 = exprl_outcome_qwen3_4b (default) or exprl_process_qwen3_4b,
#    run directory $EXPRL_PIPELINE_DIR/stage1 (requeues resume it there).
# 2. Stage II (1 node, starts after Stage I succeeded): exports Stage I's final checkpoint to a Hugging Face model
#    ($EXPRL_PIPELINE_DIR/stage1_hf, `rise-nemo export`; skipped when present), then sparse GRPO
#    (recipes/exprl_stage2_qwen3_4b.yaml) from it in $EXPRL_PIPELINE_DIR/stage2 (requeues resume it there).
# `--dry-run` (or RISE_DRY_RUN=1) prints the two sbatch commands without submitting.
#   bash slurm/pipelines/exprl_qwen3_4b.sh [--dry-run]
set -euo pipefail
RISE_DRY_RUN=${RISE_DRY_RUN:-0}
while (($#)); do
  case $1 in
    --dry-run) RISE_DRY_RUN=1 ;;
    -h | --help) sed -n '2,11p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "[rise-slurm] ERROR: unknown argument '$1' (expected --dry-run; settings are environment variables)" >&2; exit 2 ;;
  esac
  shift
done
[[ $RISE_DRY_RUN == 0 || $RISE_DRY_RUN == 1 ]] || { echo "[rise-slurm] ERROR: RISE_DRY_RUN must be 0 or 1 (got '$RISE_DRY_RUN')" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)  # slurm/
STAGE1=${EXPRL_STAGE1:-exprl_outcome_qwen3_4b}
ROOT=${EXPRL_PIPELINE_DIR:-$PWD/runs/exprl_pipeline_qwen3_4b}
[[ $ROOT == /* ]] || ROOT=$PWD/$ROOT
STAGE2_CMD="python -m rise_nemo.cli export $ROOT/stage1 $ROOT/stage1_hf && EXPRL_STAGE1_MODEL=$ROOT/stage1_hf \
python -m rise_nemo.cli train --config recipes/exprl_stage2_qwen3_4b.yaml run.dir=$ROOT/stage2"
if [[ $RISE_DRY_RUN == 1 ]]; then
  echo "RISE_RUN_DIR=$ROOT/stage1 sbatch --parsable $HERE/$STAGE1.sh"
  echo "RISE_RUN_DIR=$ROOT/stage2 RISE_DRIVER_CMD='$STAGE2_CMD' sbatch --dependency=afterok:<stage 1> $HERE/exprl_stage2_qwen3_4b.sh"
  exit 0
fi
stage1=$(RISE_RUN_DIR=$ROOT/stage1 sbatch --parsable "$HERE/$STAGE1.sh")
stage2=$(RISE_RUN_DIR=$ROOT/stage2 RISE_DRIVER_CMD=$STAGE2_CMD sbatch --parsable --dependency=afterok:"$stage1" \
  "$HERE/exprl_stage2_qwen3_4b.sh")
echo "stage I: job $stage1 ($STAGE1) -> $ROOT/stage1; stage II: job $stage2 -> $ROOT/stage2"
