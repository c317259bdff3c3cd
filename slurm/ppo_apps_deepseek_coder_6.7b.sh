#!/bin/bash
#SBATCH --job-name=ppo_apps_deepseek_coder_6.7b
#SBATCH --nodes=1
#SBATCH --gpus-per-node=8
#SBATCH --ntasks-per-node=1
#SBATCH --exclusive
#SBATCH --time=04:00:00
#SBATCH --signal=B:USR1@600
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=slurm-%x-%j.out
# PPO baseline on APPS with DeepSeek-Coder-6.7B-Instruct (recipes/ppo_apps_deepseek_coder_6.7b.yaml): one
# training node (Ray head + driver) holding the policy, the value model and colocated vLLM; the
# sandboxed unit-test reward runs on the node's CPUs (bubblewrap in the container), no judge node.
#   CONTAINER=/path/nemo-rl.sqsh sbatch slurm/ppo_apps_deepseek_coder_6.7b.sh
set -a  # export every setting below to slurm/launch.sh
RISE_RECIPE=${RISE_RECIPE:-recipes/ppo_apps_deepseek_coder_6.7b.yaml}
RISE_USE_RAY=${RISE_USE_RAY:-1}
RISE_JUDGE_NODES=${RISE_JUDGE_NODES:-0}
RISE_TEACHER_NODES=${RISE_TEACHER_NODES:-0}
RISE_NUM_NODES_KEY=${RISE_NUM_NODES_KEY:-nemo.cluster.num_nodes}
# Locate the checkout: sbatch runs a spool copy of this file, so ask Slurm for the submitted path.
RISE_SBATCH_SCRIPT=$(realpath "${BASH_SOURCE[0]}")
[[ -f ${RISE_SBATCH_SCRIPT%/*}/launch.sh ]] ||
  RISE_SBATCH_SCRIPT=$(scontrol show job "${SLURM_JOB_ID:-}" | sed -n 's/^ *Command=\([^ ]*\).*/\1/p')
exec bash "${RISE_SBATCH_SCRIPT%/*}/launch.sh" "$@"
