#!/bin/bash
#SBATCH --job-name=rrl_hh_llama2_7b
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# RRL on Anthropic HH-RLHF with Llama-2-7B (recipes/rrl_hh_llama2_7b.yaml): one node; the
# training cluster (Ray head + driver; policy, value model and colocated vLLM) on 4 of its GPUs, NeMo-RL's
# RewardModelEnvironment (the Bradley-Terry reward model, RISE_REWARD_MODEL) on another; no judge node.
# The PPO baseline it is compared with: slurm/ppo_hh_llama2_7b.sh (same layout and settings).
#   CONTAINER=/path/nemo-rl.sqsh sbatch slurm/rrl_hh_llama2_7b.sh
set -a  # export every setting below to slurm/launch.sh
RISE_RECIPE=${RISE_RECIPE:-recipes/rrl_hh_llama2_7b.yaml}
RISE_USE_RAY=${RISE_USE_RAY:-1}
RISE_JUDGE_NODES=${RISE_JUDGE_NODES:-0}
RISE_TEACHER_NODES=${RISE_TEACHER_NODES:-0}
RISE_NUM_NODES_KEY=${RISE_NUM_NODES_KEY:-nemo.cluster.num_nodes}
# Locate the checkout: sbatch runs a spool copy of this file, so ask Slurm for the submitted path.
RISE_SBATCH_SCRIPT=$(realpath "${BASH_SOURCE[0]}")
[[ -f ${RISE_SBATCH_SCRIPT%/*}/launch.sh ]] ||
  RISE_SBATCH_SCRIPT=$(scontrol show job "${SLURM_JOB_ID:-}" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
exec bash "${RISE_SBATCH_SCRIPT%/*}/launch.sh" "$@"
