#!/bin/bash
#SBATCH --job-name=rise_tiny_cpu
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1
#SBATCH --cpus-per-task=2
#SBATCH --time=00:30:00
#SBATCH --signal=B:USR1@60
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# RISE-RL on the embedded CPU backend (tiny model, rule judge): a smoke test of the launcher.
# The local backend runs in one process and needs no Ray, so Ray is off by default (RISE_USE_RAY=1
# starts it anyway, on loopback when RISE_LOOPBACK=1). No judge servers: the rule judge is in-process.
#   sbatch slurm/rise_tiny_cpu.sh train.steps=4
RISE_RECIPE=${RISE_RECIPE:-recipes/rise_tiny_cpu.yaml}
RISE_USE_RAY=${RISE_USE_RAY:-0}
RISE_LOOPBACK=${RISE_LOOPBACK:-0}
RISE_JUDGE_NODES=${RISE_JUDGE_NODES:-0}
RISE_TEACHER_NODES=${RISE_TEACHER_NODES:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-0}
export GPUS_PER_NODE
# Locate the checkout: sbatch runs a spool copy of this file, so ask Slurm for the submitted path.
if [[ -f "$(dirname "${BASH_SOURCE[0]}")/launch.sh" ]]; then
  RISE_SBATCH_SCRIPT=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")
else
  RISE_SBATCH_SCRIPT=$(scontrol show job "${SLURM_JOB_ID:-}" 2>/dev/null | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
  [[ -f $RISE_SBATCH_SCRIPT ]] || RISE_SBATCH_SCRIPT=${SLURM_SUBMIT_DIR:-.}/slurm/$(basename "$0")
fi
RISE_REPO=${RISE_REPO:-$(cd "$(dirname "$RISE_SBATCH_SCRIPT")/.." && pwd)}
export RISE_SBATCH_SCRIPT RISE_REPO RISE_RECIPE RISE_USE_RAY RISE_LOOPBACK RISE_JUDGE_NODES RISE_JUDGE_MODEL \
  RISE_JUDGE_TP RISE_JUDGE_SERVE_ARGS RISE_TEACHER_NODES RISE_TEACHER_MODEL RISE_TEACHER_TP RISE_ENTRY \
  RISE_NUM_NODES_KEY
exec bash "$RISE_REPO/slurm/launch.sh" "$@"
