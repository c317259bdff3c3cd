#!/bin/bash
#SBATCH --job-name=exprl_process_qwen3_4b
#SBATCH --nodes=2
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# ExpRL-Process Stage I on Qwen3-4B-Instruct-2507 (recipes/exprl_process_qwen3_4b.yaml): 1 training node (Ray
# head + driver) and 1 judge node (Qwen3-4B-Instruct-2507, 8 vLLM replicas of TP 1); one judge call per rollout.
#   CONTAINER=/path/nemo-rl.sqsh sbatch slurm/exprl_process_qwen3_4b.sh
set -a  # export every setting below to slurm/launch.sh
RISE_RECIPE=${RISE_RECIPE:-recipes/exprl_process_qwen3_4b.yaml}
RISE_USE_RAY=${RISE_USE_RAY:-1}
RISE_JUDGE_NODES=${RISE_JUDGE_NODES:-1}
RISE_JUDGE_MODEL=${RISE_JUDGE_MODEL:-Qwen/Qwen3-4B-Instruct-2507}
RISE_JUDGE_TP=${RISE_JUDGE_TP:-1}
RISE_JUDGE_SERVE_ARGS=${RISE_JUDGE_SERVE_ARGS:---gpu-memory-utilization 0.9 --max-model-len 40960}
RISE_TEACHER_NODES=${RISE_TEACHER_NODES:-0}
RISE_NUM_NODES_KEY=${RISE_NUM_NODES_KEY:-nemo.cluster.num_nodes}
# Locate the checkout: sbatch runs a spool copy of this file, so ask Slurm for the submitted path.
RISE_SBATCH_SCRIPT=$(realpath "${BASH_SOURCE[0]}")
[[ -f ${RISE_SBATCH_SCRIPT%/*}/launch.sh ]] ||
  RISE_SBATCH_SCRIPT=$(scontrol show job "${SLURM_JOB_ID:-}" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
exec bash "${RISE_SBATCH_SCRIPT%/*}/launch.sh" "$@"
