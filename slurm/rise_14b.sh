#!/bin/bash
#SBATCH --job-name=rise_14b
#SBATCH --nodes=2
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# RISE-RL on Qwen3-14B (recipes/rise_14b.yaml, NeMo-RL backend), layout of the recipe's nemo.plan:
# 1 training node (Ray head + driver; Megatron policy with colocated vLLM) and 1 judge node (Qwen3-32B,
# 2 vLLM replicas of TP 4). More nodes (sbatch --nodes=N) add Ray workers: the launcher passes
# nemo.cluster.num_nodes=N-1, so check the layout first with `rise-nemo plan recipes/rise_14b.yaml
# --nodes N` (N counts the judge node; e.g. N=3 fits, N=4 does not divide the batch by DP 3).
#   CONTAINER=/path/nemo-rl.sqsh MOUNTS=/data:/data RISE_TRAIN_DATA=/data/train.jsonl \
#     RISE_EVAL_DATA=/data/eval.jsonl sbatch slurm/rise_14b.sh
#   bash slurm/rise_14b.sh --dry-run [--nodes N]   # print node roles and commands, start nothing
set -a  # export every setting below to slurm/launch.sh
RISE_RECIPE=${RISE_RECIPE:-recipes/rise_14b.yaml}
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
