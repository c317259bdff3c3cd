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
set -a  # export every setting below to slurm/launch.sh
RISE_RECIPE=${RISE_RECIPE:-recipes/rise_tiny_cpu.yaml}
RISE_USE_RAY=${RISE_USE_RAY:-0}
RISE_LOOPBACK=${RISE_LOOPBACK:-0}
RISE_JUDGE_NODES=${RISE_JUDGE_NODES:-0}
RISE_TEACHER_NODES=${RISE_TEACHER_NODES:-0}
GPUS_PER_NODE=${GPUS_PER_NODE:-0}
# Locate the checkout: sbatch runs a spool copy of this file, so ask Slurm for the submitted path.
RISE_SBATCH_SCRIPT=$(realpath "${BASH_SOURCE[0]}")
[[ -f ${RISE_SBATCH_SCRIPT%/*}/launch.sh ]] ||
  RISE_SBATCH_SCRIPT=$(scontrol show job "${SLURM_JOB_ID:-}" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
exec bash "${RISE_SBATCH_SCRIPT%/*}/launch.sh" "$@"
