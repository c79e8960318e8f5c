#!/usr/bin/env bash
# A throwaway single-node Slurm cluster on localhost, for tests and benchmarks.
#
#   scripts/slurm-cluster.sh start DIR   # prints "export SLURM_CONF=DIR/slurm.conf" when ready
#   scripts/slurm-cluster.sh stop DIR    # cancels its jobs, stops the daemons started in DIR
#   scripts/slurm-cluster.sh guard DIR   # waits until stdin closes, then stops (for callers
#                                        # that may die without cleaning up: they hold the
#                                        # other end of the pipe)
#
# Everything lives in DIR (a folder the caller made and later removes; its parents must be
# searchable by the munge user): munge's socket,
# slurm.conf, state, spool, pid and log files. Ports are free ones picked at start, so two
# clusters (say `make test` and `make asan` at once) do not collide. Daemons are stopped by
# the pids in their pid files, never by name. Needs root (slurmd runs jobs as their user)
# and the Debian packages slurm-wlm and munge (scripts/deps.sh slurm).
#
# Settings that matter for tests: the node claims NODE_CPUS CPUs (default 16, whatever the
# machine has; SlurmdParameters=config_overrides lets it) so that short jobs do not queue
# behind each other; OverTimeLimit=0 and KillWait=1 make a job over its time limit end as
# soon as Slurm's one-minute granularity allows; MinJobAge keeps finished jobs visible to
# `scontrol show job` for an hour, like a cluster without accounting.
set -euo pipefail

usage() { echo "usage: $0 start|stop|guard DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
action=$1
dir=$(realpath -m "$2")

# A TCP port nobody listens on (checked against /proc/net/tcp{,6}).
free_port() {
  local port hex
  while :; do
    port=$((20000 + RANDOM % 40000))
    hex=$(printf ':%04X ' "$port")
    if ! grep -q -- "$hex" /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
      echo "$port"
      return
    fi
  done
}

# Kills the process in a pid file (TERM, then KILL after 5 s) and waits for it to go.
stop_pidfile() {
  local file=$1 pid
  [[ -s $file ]] || return 0
  pid=$(<"$file")
  [[ $pid =~ ^[0-9]+$ ]] || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null || true
}

write_conf() {
  local mem_mib cpus ctld_port d_port
  mem_mib=$(awk '/MemTotal/ {print int($2 / 1024) - 2048}' /proc/meminfo)
  ((mem_mib > 512)) || mem_mib=512
  cpus=${NODE_CPUS:-16}
  ctld_port=$(free_port)
  d_port=$(free_port)
  while [[ $d_port == "$ctld_port" ]]; do d_port=$(free_port); done
  cat >"$dir/slurm.conf" <<EOF
ClusterName=nas-test
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/munge.socket
CryptoType=crypto/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
MinJobAge=3600
OverTimeLimit=0
KillWait=1
InactiveLimit=0
SlurmdParameters=config_overrides
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/slurmctld.log
SlurmdLogFile=$dir/slurmd.log
NodeName=localhost CPUs=$cpus RealMemory=$mem_mib State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
EOF
}

start() {
  [[ $(id -u) -eq 0 ]] || { echo "$0: must run as root" >&2; exit 1; }
  for tool in munged slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] ||
      { echo "$0: $tool not found (install slurm-wlm and munge: scripts/deps.sh slurm)" >&2; exit 1; }
  done
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool"
  chmod 755 "$dir" # munged runs as munge and must reach its socket folder
  chown munge: "$dir/munge"
  chmod 755 "$dir/munge"
  runuser -u munge -- /usr/sbin/munged --socket="$dir/munge/munge.socket" \
    --pid-file="$dir/munge/munged.pid" --key-file=/etc/munge/munge.key \
    --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/seed"
  write_conf
  export SLURM_CONF=$dir/slurm.conf
  /usr/sbin/slurmctld -f "$SLURM_CONF"
  /usr/sbin/slurmd -f "$SLURM_CONF"
  for _ in $(seq 150); do
    if [[ $(sinfo -h -o %T 2>/dev/null) == idle ]]; then
      echo "export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    sleep 0.1
  done
  echo "$0: node not idle after 15 s; sinfo says: $(sinfo -h -o '%T %E' 2>&1)" >&2
  tail -n 5 "$dir/slurmctld.log" "$dir/slurmd.log" >&2 2>/dev/null || true
  stop
  exit 1
}

# Cancels every job of this cluster and waits (up to 10 s) for their processes to end, so
# that no job step outlives the daemons.
cancel_jobs() {
  [[ -s $dir/slurmctld.pid ]] && kill -0 "$(<"$dir/slurmctld.pid")" 2>/dev/null || return 0
  export SLURM_CONF=$dir/slurm.conf
  scancel --me 2>/dev/null || true
  for _ in $(seq 100); do
    [[ -z $(squeue -h -t running,completing,configuring,suspended -o %i 2>/dev/null) ]] && return 0
    sleep 0.1
  done
}

stop() {
  cancel_jobs
  stop_pidfile "$dir/slurmd.pid"
  stop_pidfile "$dir/slurmctld.pid"
  stop_pidfile "$dir/munge/munged.pid"
}

case $action in
  start) start ;;
  stop) stop ;;
  guard) cat >/dev/null; stop ;;
  *) usage ;;
esac
