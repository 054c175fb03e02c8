#!/usr/bin/env bash
# A private one-node Slurm cluster (munged + slurmctld + slurmd) in a state directory, for the
# job-script tests and for trying the job scripts on a laptop or CI machine. Needs root (the
# daemons run as SlurmUser=root) and Debian's packages slurmctld slurmd slurm-client munge
# (installed with apt-get when missing; exit 3 if they cannot be).
#
#   scripts/slurm_local.sh up     [DIR]   start a fresh cluster in DIR and wait until it runs jobs
#   scripts/slurm_local.sh down   [DIR]   cancel its jobs, stop its daemons (by pid), wait
#   scripts/slurm_local.sh status [DIR]   its daemons, sinfo, squeue; exit 0 if it is up
#   scripts/slurm_local.sh env    [DIR]   print `export SLURM_CONF=DIR/etc/slurm.conf`
#   scripts/slurm_local.sh logs   [DIR]   print the tails of the daemons' logs
#
# DIR defaults to $SLURM_LOCAL_DIR, else /tmp/trident-slurm-$UID. Nothing outside DIR is
# written: key, munge socket, slurm.conf, state, spool, logs and pid files all live in it, the
# ports are free ones picked at `up`, so several clusters (and a real Slurm) can coexist.
# `up` first runs `down` on DIR (leftovers of an earlier run: stale pid files, daemons still
# running, jobs), then recreates its subdirectories and starts over. After `up`, clients need
#   export SLURM_CONF=DIR/etc/slurm.conf        (what `up` and `env` print)
#
# Settings (environment):
#   SLURM_LOCAL_CPUS=8       CPUs the node advertises (config_overrides: more than the real
#                            cores, so a 4- or 8-task job fits on a 2-core machine)
#   SLURM_LOCAL_TIMEOUT=60   seconds `up` waits for the cluster to run `srun -n1 true`
#   SLURM_LOCAL_CRED_EXPIRE=5  AuthInfo cred_expire: also how long a requeued job waits
#                            before it may start again (Slurm's default is 120 s)
#   SLURM_LOCAL_INSTALL=1    0: never call apt-get, exit 3 if the packages are missing
#
# Exit codes: 0 ok, 1 failure (daemon logs printed), 2 usage, 3 Slurm not installable here
# (no root, no apt-get, or apt-get failed) — the tests turn 3 into a skip.
set -uo pipefail

readonly PACKAGES=(slurmctld slurmd slurm-client munge)
readonly COMMANDS=(munged mungekey slurmctld slurmd sinfo srun sbatch scontrol squeue scancel)

die() { echo "slurm_local.sh: $*" >&2; exit 1; }
say() { echo "slurm_local.sh: $*" >&2; }

usage() {
  sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

action=${1:-}
[[ -n $action ]] || usage
dir=${2:-${SLURM_LOCAL_DIR:-/tmp/trident-slurm-$(id -u)}}
case $dir in /*) ;; *) dir=$PWD/$dir ;; esac
dir=${dir%/}
conf=$dir/etc/slurm.conf
cpus=${SLURM_LOCAL_CPUS:-8}
timeout_s=${SLURM_LOCAL_TIMEOUT:-60}
cred_expire=${SLURM_LOCAL_CRED_EXPIRE:-5}

pidfile() { echo "$dir/run/$1.pid"; }

# The pid in $1's pid file if that process is alive AND is that daemon started for this DIR
# (its command line names our config/key file), so a stale pid file whose pid was reused by
# an unrelated process is never acted on.
daemon_pid() {
  local name=$1 f pid cmd
  f=$(pidfile "$name")
  [[ -s $f ]] || return 1
  pid=$(tr -dc 0-9 <"$f")
  [[ -n $pid && -r /proc/$pid/cmdline ]] || return 1
  cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || return 1
  case $name in
    munged) [[ $cmd == *munged* && $cmd == *"$dir/munge/"* ]] ;;
    *) [[ $cmd == *"$name"* && $cmd == *"$conf"* ]] ;;
  esac || return 1
  echo "$pid"
}

# The processes of this cluster: its daemons and slurmstepd's (all started with
# TRIDENT_SLURM_LOCAL=DIR in their environment, which slurmd passes on to slurmstepd), and all
# their descendants (the jobs' processes). Never the caller: it lacks the marker.
cluster_processes() {
  local p roots=() queue=() kids
  for p in /proc/[0-9]*; do
    grep -qzxF "TRIDENT_SLURM_LOCAL=$dir" "$p/environ" 2>/dev/null && roots+=("${p#/proc/}")
  done
  queue=("${roots[@]}")
  while (( ${#queue[@]} > 0 )); do
    p=${queue[0]}; queue=("${queue[@]:1}")
    echo "$p"
    kids=$(ps -o pid= --ppid "$p" 2>/dev/null)
    for p in $kids; do queue+=("$p"); done
  done
}

show_logs() {
  local f
  for f in "$dir"/log/*.log; do
    [[ -f $f ]] || continue
    echo "----- $f (last 40 lines) -----" >&2
    tail -n 40 "$f" >&2
  done
}

client_env() { export SLURM_CONF=$conf; }

alive() {  # a zombie (exited, not yet reaped by its parent) counts as gone
  local st
  kill -0 "$1" 2>/dev/null || return 1
  st=$(sed -n 's/^[0-9]* (.*) \([A-Z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null)
  [[ $st != Z ]]
}

# Wait up to $1 seconds for pid $2 to exit.
wait_gone() {
  local t=$(( $1 * 10 )) pid=$2
  while (( t-- > 0 )); do
    alive "$pid" || return 0
    sleep 0.1
  done
  return 1
}

stop_daemons() {  # NAME...: SIGTERM to all, wait, SIGKILL what is left
  local name pid pids=() names=()
  for name in "$@"; do
    if pid=$(daemon_pid "$name"); then
      kill -TERM "$pid" 2>/dev/null; pids+=("$pid"); names+=("$name")
    fi
    rm -f "$(pidfile "$name")"
  done
  local i
  for i in "${!pids[@]}"; do
    if ! wait_gone 20 "${pids[i]}"; then
      say "${names[i]} (${pids[i]}) ignored SIGTERM for 20 s: SIGKILL"
      kill -KILL "${pids[i]}" 2>/dev/null; wait_gone 5 "${pids[i]}" || say "${names[i]} (${pids[i]}) still alive"
    fi
  done
}

ensure_packages() {
  local missing=() c
  for c in "${COMMANDS[@]}"; do
    command -v "$c" >/dev/null 2>&1 || PATH=$PATH:/usr/sbin:/sbin command -v "$c" >/dev/null 2>&1 \
      || missing+=("$c")
  done
  export PATH=$PATH:/usr/sbin:/sbin
  (( ${#missing[@]} == 0 )) && return 0
  say "missing ${missing[*]}"
  if [[ ${SLURM_LOCAL_INSTALL:-1} == 0 ]]; then
    say "SLURM_LOCAL_INSTALL=0: not installing ${PACKAGES[*]}"; exit 3
  fi
  local sudo_cmd=()
  if [[ $(id -u) -ne 0 ]]; then
    if sudo -n true 2>/dev/null; then sudo_cmd=(sudo -n); else
      say "not root and no passwordless sudo: cannot install ${PACKAGES[*]}"; exit 3
    fi
  fi
  command -v apt-get >/dev/null 2>&1 || { say "no apt-get: install ${PACKAGES[*]} yourself"; exit 3; }
  say "installing ${PACKAGES[*]} with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  if ! { "${sudo_cmd[@]}" apt-get update -qq &&
         "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >/dev/null; }; then
    say "apt-get install ${PACKAGES[*]} failed"; exit 3
  fi
}

free_ports() {  # two free TCP ports
  /usr/bin/python3 - <<'PY'
import socket
socks = []
for _ in range(2):
    s = socket.socket(); s.bind(("127.0.0.1", 0)); socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

cmd_down() {
  local pids p
  if [[ -f $conf ]] && daemon_pid slurmctld >/dev/null; then
    # Jobs first, so no slurmstepd outlives its slurmd.
    client_env
    if [[ -n $(timeout 10 squeue -h -o %i 2>/dev/null) ]]; then
      timeout 10 scancel --quiet --user="$(id -un)" 2>/dev/null
      local t=50
      while (( t-- > 0 )) && [[ -n $(timeout 5 squeue -h -o %i 2>/dev/null) ]]; do sleep 0.2; done
    fi
  fi
  stop_daemons slurmd slurmctld  # together: each takes 1-2 s to shut down
  stop_daemons munged
  # Whatever is left: this DIR's slurmstepd's (and daemons whose pid files were lost), marked
  # by TRIDENT_SLURM_LOCAL=DIR in their environment, and their descendants (the jobs).
  pids=$(cluster_processes | sort -un)
  if [[ -n $pids ]]; then
    say "stopping leftover job processes: ${pids//$'\n'/ }"
    for p in $pids; do kill -KILL "$p" 2>/dev/null; done
    for p in $pids; do wait_gone 5 "$p"; done
  fi
  return 0
}

write_conf() {
  local host=$1 ctld_port=$2 slurmd_port=$3
  cat >"$conf" <<EOF
# Written by scripts/slurm_local.sh up: a private one-node cluster in $dir.
ClusterName=trident-local
SlurmctldHost=$host
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire is also the time a requeued job waits before it may start again.
AuthInfo=socket=$dir/munge/munge.socket,cred_expire=$cred_expire
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$(pidfile slurmctld)
SlurmdPidFile=$(pidfile slurmd)
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
# Schedule every second (default 60 s): a requeued job restarts cred_expire s later, not ~1 min.
SchedulerParameters=sched_interval=1,bf_interval=1
MpiDefault=pmi2
ReturnToService=2
# Finished jobs stay visible to squeue/scontrol for 10 minutes (no accounting, no sacct).
MinJobAge=600
KillWait=10
InactiveLimit=0
MailProg=/bin/true
PlugStackConfig=$dir/etc/plugstack.conf
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  : >"$dir/etc/plugstack.conf"
}

wait_ready() {
  local deadline=$(( SECONDS + timeout_s )) state=""
  client_env
  while (( SECONDS < deadline )); do
    for name in munged slurmctld slurmd; do
      daemon_pid "$name" >/dev/null || { say "$name is not running"; show_logs; return 1; }
    done
    state=$(timeout 5 sinfo -h -o %T 2>/dev/null | head -n1)
    if [[ $state == idle ]] && timeout 20 srun -n1 -t 1 true 2>/dev/null; then
      return 0
    fi
    sleep 0.5
  done
  say "cluster in $dir not ready after ${timeout_s} s (node state: '${state:-?}')"
  timeout 5 sinfo -N -l >&2 2>&1
  show_logs
  return 1
}

cmd_up() {
  local host ctld_port slurmd_port t t0=$SECONDS
  ensure_packages
  [[ $(id -u) -eq 0 ]] || { say "the daemons need root (SlurmUser=root)"; exit 3; }
  cmd_down
  case $dir in /|/tmp|/root|/home|/usr*|/etc*) die "refusing to use $dir as the state directory" ;; esac
  [[ $dir != *[[:space:]]* ]] || die "the state directory must not contain white space: '$dir'"
  mkdir -p "$dir" || die "cannot create $dir"
  rm -rf "${dir:?}"/{etc,munge,state,spool,log,run}
  mkdir -p "$dir"/{etc,munge,state,spool,log,run} || die "cannot create directories in $dir"
  chmod 755 "$dir" "$dir/munge"  # munged refuses a socket directory that others cannot enter
  local sock_len=${#dir}
  (( sock_len + 20 < 108 )) || die "$dir is too long for a unix socket path; use a shorter DIR"
  host=$(hostname -s)
  read -r ctld_port slurmd_port < <(free_ports) || die "no free ports"
  write_conf "$host" "$ctld_port" "$slurmd_port"

  mungekey -c -k "$dir/munge/munge.key" >/dev/null 2>&1 \
    || dd if=/dev/urandom of="$dir/munge/munge.key" bs=1024 count=1 status=none
  chmod 400 "$dir/munge/munge.key"
  # Daemons get a clean environment: nothing of the caller's (a Slurm job's SLURM_* variables,
  # for instance) leaks into them or, through slurmd, into the jobs' slurmstepd's.
  local denv=(env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME="${HOME:-/root}" SLURM_CONF="$conf"
        TRIDENT_SLURM_LOCAL="$dir")
  "${denv[@]}" munged --key-file="$dir/munge/munge.key" --socket="$dir/munge/munge.socket" \
    --pid-file="$(pidfile munged)" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/munge.seed" --force \
    || { say "munged failed to start"; show_logs; exit 1; }
  t=50; while (( t-- > 0 )) && [[ ! -S $dir/munge/munge.socket ]]; do sleep 0.1; done
  "${denv[@]}" slurmctld -f "$conf" -c \
    || { say "slurmctld failed to start"; show_logs; cmd_down; exit 1; }
  "${denv[@]}" slurmd -f "$conf" \
    || { say "slurmd failed to start"; show_logs; cmd_down; exit 1; }
  # The daemons write their pid files a moment after forking.
  t=50
  while (( t-- > 0 )); do
    daemon_pid slurmctld >/dev/null && daemon_pid slurmd >/dev/null && break
    sleep 0.1
  done
  if ! wait_ready; then cmd_down; exit 1; fi
  say "cluster up in $dir after $(( SECONDS - t0 )) s: node $host, $cpus CPUs, ports $ctld_port/$slurmd_port"
  echo "export SLURM_CONF=$conf"
}

cmd_status() {
  local name pid ok=0
  for name in munged slurmctld slurmd; do
    if pid=$(daemon_pid "$name"); then echo "$name: running (pid $pid)"; else echo "$name: not running"; ok=1; fi
  done
  if (( ok == 0 )); then
    client_env
    echo "export SLURM_CONF=$conf"
    timeout 10 sinfo || ok=1
    timeout 10 squeue || ok=1
  fi
  return $ok
}

case $action in
  up) cmd_up ;;
  down) cmd_down; say "cluster in $dir is down" ;;
  status) cmd_status ;;
  env) echo "export SLURM_CONF=$conf" ;;
  logs) show_logs 2>&1 ;;
  -h|--help|help) usage ;;
  *) usage ;;
esac
