#!/bin/bash
# Shared Slurm launcher for every rise_nemo recipe (called by the thin slurm/<recipe>.sh scripts).
#
# Node roles in one allocation of N nodes (J = RISE_JUDGE_NODES, T = RISE_TEACHER_NODES):
#   nodes 0 .. N-J-T-1   training: Ray head + driver on node 0, Ray workers on the rest
#   next T nodes         teacher vLLM servers (RISE_TEACHER_URLS)
#   last J nodes         judge vLLM servers   (RISE_JUDGE_URLS); RISE_JUDGE_SERVER=rule serves the
#                        project's rule grader instead (rise_nemo.judges.rule_server: no GPU, no weights),
#                        to check a cluster's layout and network before spending GPU hours
# Every process runs as its own `srun --overlap` step, inside a pyxis container when CONTAINER is
# set (NeMo-RL ray.sub conventions: CONTAINER, MOUNTS) and on the host otherwise. All logs go to
# $RUN_DIR/logs/. The job's exit code is the driver's.
#
# Preemption / time limit: the sbatch scripts ask for `--signal=B:USR1@<s>`; the batch shell (this
# script) forwards USR1 to the driver, which writes a checkpoint and exits 0; the launcher then
# requeues the job (RISE_AUTO_REQUEUE=1) and the next attempt resumes from the same run directory.
# Requeue / preemption / scancel: Slurm sends SIGTERM to every step on every node at once; each srun
# client turns it into SIGKILL for its step, so servers and Ray are gone within a second while the
# driver (host mode: in the batch step) has KillWait seconds. The driver abandons a step that needs
# the dead servers and checkpoints the last complete one (rise_nemo/stopping.py).
#
# Before anything starts, a NeMo-RL recipe's layout is checked with `rise-nemo plan` for this allocation
# (nodes, GPUS_PER_NODE, the key=value overrides); a layout it rejects ends the job with exit 2
# (RISE_PLAN_CHECK=0 skips the check).
#
# Usage: bash slurm/<recipe>.sh [--dry-run] [--nodes N] [key=value ...]   (outside Slurm: dry run only)
#        sbatch [--nodes N] slurm/<recipe>.sh [key=value ...]              (RISE_DRY_RUN=1 to print only)
# The key=value arguments are passed to `rise-nemo train` as config overrides.
set -uo pipefail

PREFIX="[rise-slurm]"

# ---------------------------------------------------------------- settings (environment variables)
RISE_REPO=${RISE_REPO:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
RISE_RECIPE=${RISE_RECIPE:?RISE_RECIPE must name a recipe YAML (set by slurm/<recipe>.sh)}
RISE_SBATCH_SCRIPT=${RISE_SBATCH_SCRIPT:-}
RISE_DRY_RUN=${RISE_DRY_RUN:-0}
RISE_USE_RAY=${RISE_USE_RAY:-1}
RISE_LOOPBACK=${RISE_LOOPBACK:-0}            # 1: every address is 127.0.0.1 (single-node tests)
RISE_RAY_PORT=${RISE_RAY_PORT:-6379}
RISE_RAY_TIMEOUT=${RISE_RAY_TIMEOUT:-600}
RISE_RAY_PROBE_TIMEOUT=${RISE_RAY_PROBE_TIMEOUT:-60}  # one "how many nodes are up" query
RISE_RAY_WORKER_RESTARTS=${RISE_RAY_WORKER_RESTARTS:-2}  # per worker that exits during start-up
RISE_JUDGE_NODES=${RISE_JUDGE_NODES:-0}
RISE_JUDGE_MODEL=${RISE_JUDGE_MODEL:-Qwen/Qwen3-32B}
RISE_JUDGE_TP=${RISE_JUDGE_TP:-4}
RISE_JUDGE_PORT=${RISE_JUDGE_PORT:-8000}
RISE_JUDGE_SERVE_ARGS=${RISE_JUDGE_SERVE_ARGS:-}
RISE_JUDGE_SERVER=${RISE_JUDGE_SERVER:-vllm}  # vllm | rule (the rule-grader server: layout/network smoke test)
RISE_PLAN_CHECK=${RISE_PLAN_CHECK:-1}        # 1: refuse a NeMo-RL layout that `rise-nemo plan` rejects
# The driver is told what was served through the environment, which the recipes read
# (RISE_JUDGE_URLS / RISE_TEACHER_URLS: JSON lists of .../v1 URLs; RISE_JUDGE_MODEL; RISE_TEACHER_URL:
# the first teacher URL), and through these config overrides (empty: not passed).
RISE_JUDGE_URLS_KEY=${RISE_JUDGE_URLS_KEY-judge.base_urls}
RISE_JUDGE_MODEL_KEY=${RISE_JUDGE_MODEL_KEY-judge.model}
# Python arguments of the driver, followed by --config RECIPE run.dir=RUN_DIR and the overrides.
RISE_ENTRY=${RISE_ENTRY:--m rise_nemo.cli train}
# Config key that receives the number of training nodes (e.g. nemo.cluster.num_nodes), so the trainer
# uses every Ray node of the allocation; empty: not passed.
RISE_NUM_NODES_KEY=${RISE_NUM_NODES_KEY:-}
RISE_TEACHER_NODES=${RISE_TEACHER_NODES:-0}
RISE_TEACHER_MODEL=${RISE_TEACHER_MODEL:-Qwen/Qwen3-32B}
RISE_TEACHER_TP=${RISE_TEACHER_TP:-4}
RISE_TEACHER_PORT=${RISE_TEACHER_PORT:-8100}
RISE_TEACHER_SERVE_ARGS=${RISE_TEACHER_SERVE_ARGS:-}
RISE_SERVER_TIMEOUT=${RISE_SERVER_TIMEOUT:-1800}
RISE_HEALTH_PATH=${RISE_HEALTH_PATH:-/health} # vLLM's; any OpenAI-compatible server answers /v1/models
RISE_SERVER_MAX_RESTARTS=${RISE_SERVER_MAX_RESTARTS:-5}
RISE_SERVER_RESTART_DELAY=${RISE_SERVER_RESTART_DELAY:-15}
RISE_AUTO_REQUEUE=${RISE_AUTO_REQUEUE:-1}
RISE_SHARE_NODES=${RISE_SHARE_NODES:-0}      # 1: servers also run on training nodes (1-node debugging, tests)
RISE_DRIVER_CMD=${RISE_DRIVER_CMD:-}         # replaces `rise-nemo train ...` (debugging, tests)
RISE_SERVE_CMD=${RISE_SERVE_CMD:-}           # replaces `vllm serve ...` (tests); sees HOST PORT MODEL TP
GPUS_PER_NODE=${GPUS_PER_NODE:-${SLURM_GPUS_PER_NODE:-8}}
GPUS_PER_NODE=${GPUS_PER_NODE##*:} # --gpus-per-node=h200:8 gives SLURM_GPUS_PER_NODE=h200:8
CONTAINER=${CONTAINER:-}
MOUNTS=${MOUNTS:-}
# Ray's own ports, all below the Linux ephemeral range (32768+) so they never collide with outgoing
# connections, and clear of every other port a node uses (one table: rise_nemo/ports.py, docs/slurm.md
# "Ports"): the worker-port range (NeMo-RL ray.sub's size) sits above NeMo-RL's rendezvous range (25000-27999)
# and away from vLLM's (20001 + 100 per engine), which the old 20000-20512 overlapped.
RAY_NODE_MANAGER_PORT=${RAY_NODE_MANAGER_PORT:-6800}
RAY_OBJECT_MANAGER_PORT=${RAY_OBJECT_MANAGER_PORT:-6801}
RAY_DASHBOARD_AGENT_LISTEN_PORT=${RAY_DASHBOARD_AGENT_LISTEN_PORT:-6802}
RAY_DASHBOARD_AGENT_GRPC_PORT=${RAY_DASHBOARD_AGENT_GRPC_PORT:-6803}
RAY_RUNTIME_ENV_AGENT_PORT=${RAY_RUNTIME_ENV_AGENT_PORT:-6804}
RAY_METRICS_EXPORT_PORT=${RAY_METRICS_EXPORT_PORT:-6805}
RAY_DASHBOARD_PORT=${RAY_DASHBOARD_PORT:-8265}
RAY_INCLUDE_DASHBOARD=${RAY_INCLUDE_DASHBOARD:-true}
RAY_CLIENT_SERVER_PORT=${RAY_CLIENT_SERVER_PORT:-10001}
RAY_MIN_WORKER_PORT=${RAY_MIN_WORKER_PORT:-29001}
RAY_MAX_WORKER_PORT=${RAY_MAX_WORKER_PORT:-29512}

DRY_NODES=""
OVERRIDES=()

die() {
  echo "$PREFIX ERROR: $*" >&2
  [[ ${LAUNCH_LOG:-/dev/null} == /dev/null ]] || echo "$PREFIX ERROR: $*" >>"$LAUNCH_LOG"
  exit 2
}

# Every numeric setting is checked up front, so a typo fails with the variable's name, not mid-job.
check_numbers() {
  local name
  for name in RISE_JUDGE_NODES RISE_TEACHER_NODES RISE_JUDGE_TP RISE_TEACHER_TP RISE_JUDGE_PORT RISE_TEACHER_PORT \
    RISE_RAY_PORT RISE_RAY_TIMEOUT RISE_RAY_PROBE_TIMEOUT RISE_RAY_WORKER_RESTARTS RISE_SERVER_TIMEOUT RISE_SERVER_MAX_RESTARTS RISE_SERVER_RESTART_DELAY \
    GPUS_PER_NODE RAY_NODE_MANAGER_PORT RAY_OBJECT_MANAGER_PORT RAY_DASHBOARD_AGENT_LISTEN_PORT \
    RAY_DASHBOARD_AGENT_GRPC_PORT RAY_RUNTIME_ENV_AGENT_PORT RAY_METRICS_EXPORT_PORT RAY_DASHBOARD_PORT \
    RAY_CLIENT_SERVER_PORT RAY_MIN_WORKER_PORT RAY_MAX_WORKER_PORT; do
    [[ ${!name} =~ ^[0-9]+$ ]] || die "$name must be a non-negative integer (got '${!name}')"
  done
  for name in RISE_DRY_RUN RISE_USE_RAY RISE_LOOPBACK RISE_AUTO_REQUEUE RISE_SHARE_NODES RISE_PLAN_CHECK; do
    [[ ${!name} == 0 || ${!name} == 1 ]] || die "$name must be 0 or 1 (got '${!name}')"
  done
  [[ $RISE_JUDGE_SERVER == vllm || $RISE_JUDGE_SERVER == rule ]] ||
    die "RISE_JUDGE_SERVER must be vllm or rule (got '$RISE_JUDGE_SERVER')"
}

parse_args() {
  while (($#)); do
    case $1 in
      --dry-run) RISE_DRY_RUN=1 ;;
      --nodes) DRY_NODES=${2:?--nodes needs a number}; shift ;;
      --nodes=*) DRY_NODES=${1#--nodes=} ;;
      -h | --help) sed -n '2,25p' "${BASH_SOURCE[0]}"; exit 0 ;;
      *=*) OVERRIDES+=("$1") ;;
      *) die "unknown argument '$1' (expected --dry-run, --nodes N or key=value overrides)" ;;
    esac
    shift
  done
}

# ---------------------------------------------------------------- logging and command execution
LAUNCH_LOG=/dev/null

log() {
  local line
  printf -v line '%s %(%F %T)T %s' "$PREFIX" -1 "$*"
  echo "$line"
  [[ $LAUNCH_LOG == /dev/null ]] || echo "$line" >>"$LAUNCH_LOG"
}

# Prints a command so that it can be pasted into a shell.
quote_cmd() {
  local out
  printf -v out '%q ' "$@"
  echo "${out% }"
}

is_dry() { [[ $RISE_DRY_RUN == 1 ]]; }

# ---------------------------------------------------------------- allocation and roles
NODES=()
IPS=()

resolve_nodes() {
  if [[ -n ${SLURM_JOB_NODELIST:-} ]]; then
    mapfile -t NODES < <(scontrol show hostnames "$SLURM_JOB_NODELIST")
  elif is_dry; then
    # Outside Slurm the dry run invents node names; the count is --nodes or the script's #SBATCH line.
    local n=$DRY_NODES
    if [[ -z $n && -n $RISE_SBATCH_SCRIPT ]]; then
      n=$(sed -n 's/^#SBATCH --nodes=\([0-9]*\).*/\1/p' "$RISE_SBATCH_SCRIPT" | head -1)
    fi
    [[ $n =~ ^[1-9][0-9]*$ ]] || die "dry run outside Slurm needs --nodes N (got '${n}')"
    local i
    for ((i = 0; i < n; i++)); do NODES+=("node-$i"); done
  else
    die "not inside a Slurm job (no SLURM_JOB_NODELIST): submit with sbatch, or use --dry-run"
  fi
  if [[ -n $DRY_NODES && $DRY_NODES != "${#NODES[@]}" ]]; then
    die "--nodes $DRY_NODES does not match the allocation (${#NODES[@]} nodes); use sbatch --nodes"
  fi
}

# Address a node's servers bind to and other nodes connect to: its cluster interface, never 0.0.0.0.
node_ip() {
  local node=$1 ip
  if [[ $RISE_LOOPBACK == 1 ]]; then
    echo 127.0.0.1
    return
  fi
  if is_dry && [[ -z ${SLURM_JOB_NODELIST:-} ]]; then
    echo "<ip-of-$node>"
    return
  fi
  ip=$(getent hosts "$node" | awk 'NR == 1 { print $1 }')
  # Debian-style /etc/hosts maps the own hostname to 127.0.1.1: ask the node for its real address.
  if [[ -z $ip || $ip == 127.* ]]; then
    ip=$(srun --overlap --nodes=1 --ntasks=1 -w "$node" hostname -I 2>/dev/null | awk '{ print $1 }')
  fi
  echo "${ip:-$node}"
}

N_TRAIN=0
TRAIN_NODES=()
TEACHER_NODES=()
JUDGE_NODES=()

assign_roles() {
  local n=${#NODES[@]}
  N_TRAIN=$((n - RISE_JUDGE_NODES - RISE_TEACHER_NODES))
  if [[ $RISE_SHARE_NODES == 1 ]]; then
    # Servers take the last nodes but those nodes keep training too (they share CPUs and GPUs).
    ((RISE_JUDGE_NODES + RISE_TEACHER_NODES <= n)) || die "RISE_SHARE_NODES=1 still needs >= $((RISE_JUDGE_NODES + RISE_TEACHER_NODES)) nodes"
    TRAIN_NODES=("${NODES[@]}")
    N_TRAIN=$n
    TEACHER_NODES=("${NODES[@]:n-RISE_JUDGE_NODES-RISE_TEACHER_NODES:RISE_TEACHER_NODES}")
    JUDGE_NODES=("${NODES[@]:n-RISE_JUDGE_NODES:RISE_JUDGE_NODES}")
  elif ((N_TRAIN < 1)); then
    die "$n node(s) cannot hold training plus $RISE_TEACHER_NODES teacher and $RISE_JUDGE_NODES judge node(s): submit with --nodes >= $((RISE_JUDGE_NODES + RISE_TEACHER_NODES + 1))"
  else
    TRAIN_NODES=("${NODES[@]:0:N_TRAIN}")
    TEACHER_NODES=("${NODES[@]:N_TRAIN:RISE_TEACHER_NODES}")
    JUDGE_NODES=("${NODES[@]:N_TRAIN+RISE_TEACHER_NODES:RISE_JUDGE_NODES}")
  fi
}

resolve_ips() {
  local node
  for node in "${NODES[@]}"; do IPS+=("$(node_ip "$node")"); done
}

ip_of() {
  local i
  for i in "${!NODES[@]}"; do
    [[ ${NODES[$i]} == "$1" ]] && { echo "${IPS[$i]}"; return; }
  done
}

# ---------------------------------------------------------------- srun steps
GRES_ARG=()

# Exclusive jobs do not hand their GPUs to steps unless the step asks (as in NeMo-RL's ray.sub).
detect_gres() {
  if [[ -n ${SLURM_JOB_PARTITION:-} ]] && ! is_dry &&
    sinfo -p "$SLURM_JOB_PARTITION" -h -o %G 2>/dev/null | grep -q 'gpu:'; then
    GRES_ARG=(--gres="gpu:$GPUS_PER_NODE")
  fi
}

# srun_cmd NODE CONTAINER_NAME: prints nothing, fills the array SRUN with the step prefix.
SRUN=()
srun_prefix() {
  local node=$1 name=$2
  SRUN=(srun --overlap --nodes=1 --ntasks=1 -w "$node" --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}"
    --kill-on-bad-exit=0 "${GRES_ARG[@]}")
  if [[ -n $CONTAINER ]]; then
    # The checkout and the run directory appear at the same paths inside the container.
    local mounts="$RISE_REPO:$RISE_REPO"
    [[ $RUN_DIR == "$RISE_REPO"/* ]] || mounts+=",$RUN_DIR:$RUN_DIR"
    [[ -n $MOUNTS ]] && mounts="$MOUNTS,$mounts"
    SRUN+=(--container-image="$CONTAINER" --container-mounts="$mounts" --container-workdir="$RISE_REPO"
      --no-container-mount-home --container-name="rise-$name")
  fi
}

BG_PIDS=()

# start_step ROLE NODE CONTAINER_NAME LOG CMD...: one background srun step (prints it in a dry run).
start_step() {
  local role=$1 node=$2 name=$3 logfile=$4
  shift 4
  srun_prefix "$node" "$name"
  if is_dry; then
    echo "[dry-run] $role@$node: $(quote_cmd "${SRUN[@]}" "$@") >> $logfile"
    return
  fi
  "${SRUN[@]}" "$@" >>"$logfile" 2>&1 &
  BG_PIDS+=($!)
  log "started $role on $node (srun pid $!, log $logfile)"
}

# ---------------------------------------------------------------- Ray cluster
ray_common_args() {
  RAY_ARGS=(--disable-usage-stats --num-gpus="$GPUS_PER_NODE" --block
    --node-manager-port="$RAY_NODE_MANAGER_PORT" --object-manager-port="$RAY_OBJECT_MANAGER_PORT"
    --dashboard-agent-listen-port="$RAY_DASHBOARD_AGENT_LISTEN_PORT"
    --dashboard-agent-grpc-port="$RAY_DASHBOARD_AGENT_GRPC_PORT"
    --runtime-env-agent-port="$RAY_RUNTIME_ENV_AGENT_PORT" --metrics-export-port="$RAY_METRICS_EXPORT_PORT"
    --min-worker-port="$RAY_MIN_WORKER_PORT" --max-worker-port="$RAY_MAX_WORKER_PORT")
}

# Ray >= 2.5x authenticates its RPCs with a token. One token per run, in the run directory (which every
# container mounts): all nodes share it, and no user-wide ~/.ray/auth_token is read or overwritten.
# RAY_AUTH_MODE=disabled, or your own RAY_AUTH_TOKEN_PATH, in the environment overrides this. A bare
# RAY_AUTH_MODE=token does not: ray.init() exports it into its own process, so a job submitted from a
# Python process that once ran Ray inherits it without any token file to go with it.
setup_ray_auth() {
  [[ ${RAY_AUTH_MODE:-} == disabled || -n ${RAY_AUTH_TOKEN_PATH:-} ]] && return
  export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$LOG_DIR/ray_auth_token
  if is_dry; then
    echo "[dry-run] env: RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=$RAY_AUTH_TOKEN_PATH (a fresh random token)"
    return
  fi
  if [[ ! -s $RAY_AUTH_TOKEN_PATH ]]; then
    (
      umask 077
      od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >"$RAY_AUTH_TOKEN_PATH"
    ) || die_run "cannot write $RAY_AUTH_TOKEN_PATH"
  fi
}

start_ray() {
  local head=${TRAIN_NODES[0]} head_ip i node
  setup_ray_auth
  head_ip=$(ip_of "$head")
  RAY_ADDRESS="$head_ip:$RISE_RAY_PORT"
  export RAY_ADDRESS
  ray_common_args
  start_step ray-head "$head" ray-head "$LOG_DIR/ray-head.log" \
    "$RISE_RAY_BIN" start --head --node-ip-address="$head_ip" --port="$RISE_RAY_PORT" \
    --include-dashboard="$RAY_INCLUDE_DASHBOARD" --dashboard-host="$head_ip" --dashboard-port="$RAY_DASHBOARD_PORT" \
    --ray-client-server-port="$RAY_CLIENT_SERVER_PORT" "${RAY_ARGS[@]}"
  # Workers join a head that is up (as NeMo-RL's ray.sub does): a worker whose raylet cannot register
  # within Ray's fixed 30 s, because the head's GCS is still starting on a busy node, exits.
  ((N_TRAIN > 1)) && wait_for_ray 1
  for ((i = 1; i < N_TRAIN; i++)); do start_ray_worker "$i"; done
}

declare -A RAY_WORKER_PID=() RAY_WORKER_RESTARTS=()

start_ray_worker() {
  local i=$1 node=${TRAIN_NODES[$1]}
  start_step "ray-worker-$i" "$node" "ray-worker-$i" "$LOG_DIR/ray-worker-$i.log" \
    "$RISE_RAY_BIN" start --address="$RAY_ADDRESS" --node-ip-address="$(ip_of "$node")" "${RAY_ARGS[@]}"
  is_dry || RAY_WORKER_PID[$i]=${BG_PIDS[-1]}
}

# A worker whose raylet misses Ray's fixed 30 s registration window (GCS busy) exits during start-up:
# start it again, up to RISE_RAY_WORKER_RESTARTS times each. Returns 1 when one is out of restarts.
restart_dead_ray_workers() {
  local i pid kept=()
  for i in "${!RAY_WORKER_PID[@]}"; do
    kill -0 "${RAY_WORKER_PID[$i]}" 2>/dev/null && continue
    RAY_WORKER_RESTARTS[$i]=$((${RAY_WORKER_RESTARTS[$i]:-0} + 1))
    ((RAY_WORKER_RESTARTS[$i] > RISE_RAY_WORKER_RESTARTS)) && return 1
    for pid in "${BG_PIDS[@]}"; do [[ $pid == "${RAY_WORKER_PID[$i]}" ]] || kept+=("$pid"); done
    BG_PIDS=("${kept[@]}")
    log "ray-worker-$i exited during start-up (see $LOG_DIR/ray-worker-$i.log): restart ${RAY_WORKER_RESTARTS[$i]}/$RISE_RAY_WORKER_RESTARTS"
    start_ray_worker "$i"
  done
}

all_steps_alive() {
  local pid
  for pid in "${BG_PIDS[@]}"; do
    kill -0 "$pid" 2>/dev/null || return 1
  done
}

# wait_for_ray N: waits until N Ray nodes are alive, asking the head with a small Python probe.
wait_for_ray() {
  local want=$1
  # Prints the number of alive nodes and their addresses (which node joined from where).
  local probe="import ray; ray.init(address='$RAY_ADDRESS', logging_level='ERROR'); a = sorted(n['NodeManagerAddress'] for n in ray.nodes() if n['Alive']); print(len(a), *a)"
  srun_prefix "${TRAIN_NODES[0]}" ray-head
  if is_dry; then
    echo "[dry-run] wait-ray@${TRAIN_NODES[0]}: until $want alive Ray node(s) (timeout ${RISE_RAY_TIMEOUT}s): $(quote_cmd "${SRUN[@]}" "$RISE_PYTHON" -c "$probe")"
    return
  fi
  local start=$SECONDS reply alive delay=2
  while :; do
    # A dead head makes ray.init() retry for minutes: check the steps first and bound each probe.
    restart_dead_ray_workers || die_run "a Ray worker kept dying during start-up; see $LOG_DIR/ray-worker-*.log"
    all_steps_alive || die_run "a Ray step died during start-up; see $LOG_DIR/ray-*.log"
    reply=$(timeout "$RISE_RAY_PROBE_TIMEOUT" "${SRUN[@]}" "$RISE_PYTHON" -c "$probe" 2>>"$LOG_DIR/ray-probe.log" | tail -1)
    alive=${reply%% *}
    [[ $alive =~ ^[0-9]+$ ]] || alive=0
    log "Ray nodes alive: $alive/$want${reply#"$alive"}"
    ((alive >= want)) && return 0
    restart_dead_ray_workers || die_run "a Ray worker kept dying during start-up; see $LOG_DIR/ray-worker-*.log"
    all_steps_alive || die_run "a Ray step died during start-up; see $LOG_DIR/ray-*.log"
    ((SECONDS - start > RISE_RAY_TIMEOUT)) && die_run "Ray cluster not up after ${RISE_RAY_TIMEOUT}s; see $LOG_DIR/ray-*.log"
    sleep "$delay"
    ((delay < 10)) && delay=$((delay * 2))
  done
}

# ---------------------------------------------------------------- judge / teacher servers
SERVER_URLS=()

# supervise NAME NODE LOG CMD...: keeps one server step running; restarts it when it dies.
supervise() {
  local name=$1 node=$2 logfile=$3 child=0 restarts=0 rc
  shift 3
  trap 'kill -TERM "$child" 2>/dev/null; exit 0' TERM
  while :; do
    "$@" >>"$logfile" 2>&1 &
    child=$!
    wait "$child"
    rc=$?
    [[ -e $STOP_FILE ]] && exit 0
    restarts=$((restarts + 1))
    if ((restarts > RISE_SERVER_MAX_RESTARTS)); then
      log "$name on $node exited (rc=$rc) after $RISE_SERVER_MAX_RESTARTS restarts: giving up"
      touch "$LOG_DIR/$name.FAILED"
      exit 1
    fi
    log "$name on $node exited (rc=$rc): restart $restarts/$RISE_SERVER_MAX_RESTARTS in ${RISE_SERVER_RESTART_DELAY}s"
    echo "$restarts" >"$LOG_DIR/$name.restarts"
    sleep "$RISE_SERVER_RESTART_DELAY"
  done
}

# start_servers KIND MODEL TP PORT EXTRA_ARGS NODE...: GPUS_PER_NODE/TP replicas per node, one per
# GPU slice, each on its own port (PORT, PORT+1, ...), bound to the node's cluster address.
start_servers() {
  local kind=$1 model=$2 tp=$3 port0=$4 extra=$5 node ip r replicas cmd name first gpus
  shift 5
  (($#)) || return 0
  if ((GPUS_PER_NODE == 0)); then
    replicas=1 # CPU-only allocation (tests): one server per node, no GPU slicing
  else
    ((tp >= 1 && tp <= GPUS_PER_NODE)) || die "$kind TP $tp must be between 1 and GPUS_PER_NODE=$GPUS_PER_NODE"
    replicas=$((GPUS_PER_NODE / tp))
  fi
  # shellcheck disable=SC2016  # expanded later, inside the step, from the exported HOST PORT MODEL TP
  local serve='exec vllm serve "$MODEL" --host "$HOST" --port "$PORT" --tensor-parallel-size "$TP"'
  [[ -n $extra ]] && serve+=" $extra"
  if [[ $kind == judge && $RISE_JUDGE_SERVER == rule ]]; then
    # The project's OpenAI-compatible rule grader (answers any model name, GET /health like vLLM).
    # shellcheck disable=SC2016  # HOST and PORT are expanded inside the step, as above
    serve="exec $(printf '%q' "$RISE_PYTHON")"' -m rise_nemo.judges.rule_server --host "$HOST" --port "$PORT"'
  fi
  [[ -n $RISE_SERVE_CMD ]] && serve=$RISE_SERVE_CMD
  for node in "$@"; do
    ip=$(ip_of "$node")
    for ((r = 0; r < replicas; r++)); do
      name="$kind-$node-$r"
      first=$((r * tp))
      # CUDA_VISIBLE_DEVICES slices the node's GPUs between replicas.
      gpus=""
      ((GPUS_PER_NODE > 0)) && gpus=" CUDA_VISIBLE_DEVICES=$(seq -s, "$first" $((first + tp - 1)))"
      cmd="export HOST=$ip PORT=$((port0 + r)) MODEL=$model TP=$tp$gpus; $serve"
      srun_prefix "$node" "$kind-$r"
      SERVER_URLS+=("$kind http://$ip:$((port0 + r))")
      if is_dry; then
        echo "[dry-run] $kind-$r@$node: $(quote_cmd "${SRUN[@]}" bash -c "$cmd") >> $LOG_DIR/$name.log (restarted on exit, up to $RISE_SERVER_MAX_RESTARTS times)"
        continue
      fi
      supervise "$name" "$node" "$LOG_DIR/$name.log" "${SRUN[@]}" bash -c "$cmd" &
      BG_PIDS+=($!)
      log "started $name: $model TP=$tp on $node at http://$ip:$((port0 + r)) (log $LOG_DIR/$name.log)"
    done
  done
}

# urls_of KIND: JSON list of the KIND servers' OpenAI-compatible base URLs.
urls_of() {
  local kind=$1 entry out=()
  for entry in "${SERVER_URLS[@]}"; do
    [[ $entry == "$kind "* ]] && out+=("\"${entry#* }/v1\"")
  done
  local IFS=,
  echo "[${out[*]}]"
}

# Health check: every server answers GET $RISE_HEALTH_PATH with 200 before training starts.
wait_for_servers() {
  ((${#SERVER_URLS[@]})) || return 0
  local entry url start=$SECONDS pending delay=1
  if is_dry; then
    for entry in "${SERVER_URLS[@]}"; do
      echo "[dry-run] health-check: curl -sf --noproxy '*' ${entry#* }$RISE_HEALTH_PATH (timeout ${RISE_SERVER_TIMEOUT}s)"
    done
    return
  fi
  command -v curl >/dev/null || die_run "curl not found on $(hostname) (the batch host): it runs the server health checks"
  while :; do
    pending=0
    for entry in "${SERVER_URLS[@]}"; do
      url="${entry#* }$RISE_HEALTH_PATH"
      curl -sf --noproxy '*' -o /dev/null --max-time 5 "$url" || pending=$((pending + 1))
    done
    ((pending == 0)) && { log "all ${#SERVER_URLS[@]} server(s) healthy"; return 0; }
    compgen -G "$LOG_DIR/*.FAILED" >/dev/null && die_run "a server failed for good: $(ls "$LOG_DIR"/*.FAILED)"
    ((SECONDS - start > RISE_SERVER_TIMEOUT)) && die_run "$pending server(s) not healthy after ${RISE_SERVER_TIMEOUT}s; see $LOG_DIR/*.log"
    log "waiting for $pending/${#SERVER_URLS[@]} server(s) to become healthy"
    sleep "$delay"
    ((delay < 10)) && delay=$((delay * 2))
  done
}

# ---------------------------------------------------------------- driver
DRIVER_PID=""
GOT_USR1=0

# shellcheck disable=SC2317  # invoked by `trap`
forward_usr1() {
  GOT_USR1=1
  log "received USR1 (time limit / preemption notice): asking the driver to checkpoint and exit"
  [[ -n $DRIVER_PID ]] && kill -USR1 "$DRIVER_PID" 2>/dev/null
}

# TERM reaches every step directly from Slurm (scancel, scontrol requeue, preemption), driver included,
# so it is only logged here: forwarding it again would signal the driver twice.
# shellcheck disable=SC2317  # invoked by `trap`
note_term() {
  log "received TERM: Slurm stops every step (servers and Ray too); the driver checkpoints its last complete step within KillWait; waiting for it"
}

driver_command() {
  if [[ -n $RISE_DRIVER_CMD ]]; then
    DRIVER=(bash -c "$RISE_DRIVER_CMD")
  else
    local entry
    read -r -a entry <<<"$RISE_ENTRY"
    DRIVER=("$RISE_PYTHON" "${entry[@]}" --config "$RISE_RECIPE" "run.dir=$RUN_DIR")
    [[ -n $RISE_NUM_NODES_KEY ]] && DRIVER+=("$RISE_NUM_NODES_KEY=$N_TRAIN")
    # The judge client talks to exactly the servers and model started here (user overrides win).
    if ((${#JUDGE_NODES[@]})); then
      [[ -n $RISE_JUDGE_URLS_KEY ]] && DRIVER+=("$RISE_JUDGE_URLS_KEY=$RISE_JUDGE_URLS")
      [[ -n $RISE_JUDGE_MODEL_KEY ]] && DRIVER+=("$RISE_JUDGE_MODEL_KEY=$RISE_JUDGE_MODEL")
    fi
    DRIVER+=("${OVERRIDES[@]}")
  fi
}

run_driver() {
  local head=${TRAIN_NODES[0]} rc
  export RISE_JUDGE_URLS RISE_TEACHER_URLS RISE_TEACHER_URL RISE_JUDGE_MODEL RISE_TEACHER_MODEL RISE_RUN_DIR=$RUN_DIR
  RISE_JUDGE_URLS=$(urls_of judge)
  RISE_TEACHER_URLS=$(urls_of teacher)
  RISE_TEACHER_URL=${RISE_TEACHER_URLS#[}
  RISE_TEACHER_URL=${RISE_TEACHER_URL%%[],]*}
  RISE_TEACHER_URL=${RISE_TEACHER_URL//\"/}
  driver_command
  # Host mode: the driver runs in the batch step itself (the batch script runs on node 0). Under srun it
  # could not checkpoint on `scontrol requeue` or preemption: Slurm's SIGTERM reaches every process of the
  # batch step, the driver's srun client included, and srun answers SIGTERM by sending SIGKILL to its
  # step. In container mode the driver needs its srun step (pyxis); there the USR1 path
  # (--signal=B:USR1@<s>) and periodic checkpoints are what survive a preemption.
  SRUN=()
  [[ -n $CONTAINER ]] && srun_prefix "$head" ray-head
  if is_dry; then
    echo "[dry-run] env: RISE_RUN_DIR=$RUN_DIR RISE_JUDGE_URLS=$RISE_JUDGE_URLS RISE_JUDGE_MODEL=$RISE_JUDGE_MODEL RISE_TEACHER_URLS=$RISE_TEACHER_URLS RISE_TEACHER_URL=$RISE_TEACHER_URL RAY_ADDRESS=${RAY_ADDRESS:-}"
    echo "[dry-run] driver@$head: $(quote_cmd "${SRUN[@]}" "${DRIVER[@]}") >> $LOG_DIR/driver.log$([[ -z $CONTAINER ]] && echo " (in the batch step)")"
    return 0
  fi
  if ((GOT_USR1)); then
    # The time-limit notice came while servers or Ray were starting: no time left to train.
    log "USR1 arrived before the driver started: not starting it"
    return 0
  fi
  log "driver on $head: $(quote_cmd "${DRIVER[@]}") (log $LOG_DIR/driver.log)"
  "${SRUN[@]}" "${DRIVER[@]}" >>"$LOG_DIR/driver.log" 2>&1 &
  DRIVER_PID=$!
  # `wait` returns early when a trapped signal arrives; keep waiting until the driver itself exits.
  while kill -0 "$DRIVER_PID" 2>/dev/null; do wait "$DRIVER_PID"; done
  wait "$DRIVER_PID"
  rc=$?
  log "driver exited with code $rc"
  return "$rc"
}

# ---------------------------------------------------------------- shutdown
stop_steps() {
  is_dry && return
  touch "$STOP_FILE"
  local pid
  for pid in "${BG_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  # srun forwards TERM to its step; give the steps a moment, then leave the rest to Slurm's job end.
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    all_dead=1
    for pid in "${BG_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && all_dead=0; done
    ((all_dead)) && break
    sleep 1
  done
}

die_run() {
  log "ERROR: $*"
  stop_steps
  exit 1
}

# ---------------------------------------------------------------- planner check
# `rise-nemo plan` for this allocation before any step starts: a NeMo-RL layout that cannot run (DP not
# dividing the batch, TP not fitting a node, memory) ends the job with exit 2 and the planner's reasons,
# instead of failing minutes later inside Megatron or vLLM. Recipes of other backends (the local CPU
# backend) have no parallel layout to check. In container mode the check runs in the container on node 0.
PLAN_PY='import sys
from rise_nemo.config.loader import load_recipe_tree
if load_recipe_tree(sys.argv[1]).get("backend") != "nemo":
    print("not a NeMo-RL recipe: no parallel layout to check")
    sys.exit(0)
from rise_nemo.cli import main
sys.exit(main(["plan", *sys.argv[1:]]))'

check_plan() {
  if [[ $RISE_PLAN_CHECK == 0 ]]; then
    log "planner check skipped (RISE_PLAN_CHECK=0)"
    return 0
  fi
  # Overrides go before the options (argparse); GPUS_PER_NODE=0 (CPU-only tests) keeps the recipe's count.
  local cmd=("$RISE_PYTHON" -c "$PLAN_PY" "$RISE_RECIPE" "${OVERRIDES[@]}" --nodes "${#NODES[@]}") out rc
  ((GPUS_PER_NODE > 0)) && cmd+=(--gpus-per-node "$GPUS_PER_NODE")
  if [[ -n $CONTAINER ]]; then
    if is_dry; then
      echo "[dry-run] plan: $(quote_cmd "${cmd[@]}") (run in the container on ${NODES[0]}; a rejected layout ends the job with exit 2)"
      return 0
    fi
    srun_prefix "${NODES[0]}" ray-head
    cmd=("${SRUN[@]}" "${cmd[@]}")
  elif is_dry && ! "$RISE_PYTHON" -c 'import rise_nemo.cli' 2>/dev/null; then
    echo "$PREFIX WARNING: planner not run: $RISE_PYTHON cannot import rise_nemo here (the real launch runs it)" >&2
    return 0
  fi
  out=$("${cmd[@]}" 2>&1)
  rc=$?
  if ((rc != 0)); then
    echo "$out" >&2
    [[ $LAUNCH_LOG == /dev/null ]] || echo "$out" >>"$LAUNCH_LOG"
    die "rise-nemo plan rejects $RISE_RECIPE on ${#NODES[@]} node(s) (exit $rc, reasons above): nothing was started; fix the recipe or the allocation (RISE_PLAN_CHECK=0 skips this check)"
  fi
  out=${out##*$'\n'}
  log "planner: $RISE_RECIPE on ${#NODES[@]} node(s): ${out#"${out%%[! ]*}"}"
}

# ---------------------------------------------------------------- main
print_plan() {
  local i role
  log "job ${SLURM_JOB_ID:-<none>} attempt SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0} recipe=$RISE_RECIPE run_dir=$RUN_DIR mode=$([[ -n $CONTAINER ]] && echo "container $CONTAINER" || echo host)"
  local n=${#NODES[@]} roles
  for i in "${!NODES[@]}"; do
    roles=()
    if ((i == 0)); then
      roles+=("$([[ $RISE_USE_RAY == 1 ]] && echo "ray-head+driver" || echo driver)")
    elif ((i < N_TRAIN)); then
      roles+=("$([[ $RISE_USE_RAY == 1 ]] && echo "ray-worker" || echo idle)")
    fi
    if ((i >= n - RISE_JUDGE_NODES)); then
      roles+=("judge($RISE_JUDGE_MODEL TP=$RISE_JUDGE_TP)")
    elif ((i >= n - RISE_JUDGE_NODES - RISE_TEACHER_NODES)); then
      roles+=("teacher($RISE_TEACHER_MODEL TP=$RISE_TEACHER_TP)")
    fi
    role=$(
      IFS=+
      echo "${roles[*]}"
    )
    log "node $i ${NODES[$i]} ${IPS[$i]}: $role"
  done
}

main() {
  parse_args "$@"
  check_numbers
  if [[ ! -f $RISE_REPO/$RISE_RECIPE && ! -f $RISE_RECIPE ]]; then
    is_dry || die "recipe $RISE_RECIPE not found under $RISE_REPO"
    echo "$PREFIX WARNING: recipe $RISE_RECIPE not found under $RISE_REPO (dry run continues)" >&2
  fi
  if [[ -z ${RISE_PYTHON:-} ]]; then
    if [[ -z $CONTAINER && -x $RISE_REPO/.venv/bin/python ]]; then RISE_PYTHON=$RISE_REPO/.venv/bin/python; else RISE_PYTHON=python; fi
  fi
  RISE_RAY_BIN=${RISE_RAY_BIN:-$([[ $RISE_PYTHON == /* && -x ${RISE_PYTHON%/*}/ray ]] && echo "${RISE_PYTHON%/*}/ray" || echo ray)}
  # The package is imported from the checkout (also inside the container); Ray workers inherit it.
  export PYTHONPATH="$RISE_REPO${PYTHONPATH:+:$PYTHONPATH}"
  [[ $RISE_LOOPBACK == 1 ]] && export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
  # One run directory per job: a requeued job keeps its SLURM_JOB_ID, hence its run directory.
  RUN_DIR=${RISE_RUN_DIR:-$RISE_REPO/runs/$(basename "$RISE_RECIPE" .yaml)-${SLURM_JOB_ID:-dryrun}}
  [[ $RUN_DIR == /* ]] || RUN_DIR=$PWD/$RUN_DIR # relative to where sbatch was called, not the checkout
  LOG_DIR=$RUN_DIR/logs
  STOP_FILE=$LOG_DIR/.stop-${SLURM_RESTART_COUNT:-0}
  cd "$RISE_REPO" || die "cannot cd to $RISE_REPO"

  resolve_nodes
  if ! is_dry; then
    mkdir -p "$LOG_DIR" || die "cannot create $LOG_DIR"
    LAUNCH_LOG=$LOG_DIR/launcher.log
    rm -f "$LOG_DIR"/*.FAILED
    trap forward_usr1 USR1
    trap note_term TERM
  fi
  assign_roles
  check_plan
  resolve_ips
  detect_gres
  print_plan

  start_servers teacher "$RISE_TEACHER_MODEL" "$RISE_TEACHER_TP" "$RISE_TEACHER_PORT" "$RISE_TEACHER_SERVE_ARGS" "${TEACHER_NODES[@]}"
  start_servers judge "$RISE_JUDGE_MODEL" "$RISE_JUDGE_TP" "$RISE_JUDGE_PORT" "$RISE_JUDGE_SERVE_ARGS" "${JUDGE_NODES[@]}"
  if [[ $RISE_USE_RAY == 1 ]]; then
    start_ray
    wait_for_ray "$N_TRAIN"
  fi
  wait_for_servers

  local rc=0
  run_driver || rc=$?
  stop_steps
  if ((GOT_USR1 && rc == 0)) && [[ $RISE_AUTO_REQUEUE == 1 && -n ${SLURM_JOB_ID:-} ]]; then
    log "driver checkpointed after USR1: requeueing job $SLURM_JOB_ID to continue"
    scontrol requeue "$SLURM_JOB_ID" || log "scontrol requeue failed: resubmit with RISE_RUN_DIR=$RUN_DIR"
  fi
  is_dry && log "dry run: nothing was started"
  exit "$rc"
}

main "$@"
