#!/bin/bash
#SBATCH --job-name=opd_14b_teacher32b
#SBATCH --nodes=3
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# On-policy distillation baseline: Qwen3-14B student, Qwen3-32B teacher (recipes/opd_14b_teacher32b.yaml),
# run by `rise-nemo distill`. NeMo-RL runs the teacher as a policy inside the
# Ray cluster (its distillation path), so nodes 0-1 are Ray training nodes (student + teacher) and the
# last node serves the rubric judge used for evaluation (Qwen3-32B, 2 vLLM replicas of TP 4).
# RISE_TEACHER_NODES=1 would instead serve a teacher with vLLM (RISE_TEACHER_URL) for recipes reading it.
#   CONTAINER=/path/nemo-rl.sqsh sbatch slurm/opd_14b_teacher32b.sh
set -a  # export every setting below to slurm/launch.sh
RISE_RECIPE=${RISE_RECIPE:-recipes/opd_14b_teacher32b.yaml}
RISE_ENTRY=${RISE_ENTRY:--m rise_nemo.cli distill}
RISE_USE_RAY=${RISE_USE_RAY:-1}
RISE_JUDGE_NODES=${RISE_JUDGE_NODES:-1}
RISE_JUDGE_MODEL=${RISE_JUDGE_MODEL:-Qwen/Qwen3-32B}
RISE_JUDGE_TP=${RISE_JUDGE_TP:-4}
RISE_JUDGE_SERVE_ARGS=${RISE_JUDGE_SERVE_ARGS:---gpu-memory-utilization 0.9 --max-model-len 16384}
RISE_TEACHER_NODES=${RISE_TEACHER_NODES:-0}
RISE_NUM_NODES_KEY=${RISE_NUM_NODES_KEY:-nemo.cluster.num_nodes}
# Locate the checkout: sbatch runs a spool copy of this file, so ask Slurm for the submitted path.
RISE_SBATCH_SCRIPT=$(realpath "${BASH_SOURCE[0]}")
[[ -f ${RISE_SBATCH_SCRIPT%/*}/launch.sh ]] ||
  RISE_SBATCH_SCRIPT=$(scontrol show job "${SLURM_JOB_ID:-}" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
exec bash "${RISE_SBATCH_SCRIPT%/*}/launch.sh" "$@"
