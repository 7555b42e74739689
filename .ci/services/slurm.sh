#!/usr/bin/env bash
# A one-host SLURM cluster for the multi-node tests: Debian's munge, slurmctld and slurmd, run as root.
#
#   .ci/services/slurm.sh start   # prints `export ...` lines (stdout only); everything else goes to stderr
#   .ci/services/slurm.sh stop    # cancels jobs, ends the daemons it started, removes its state
#
# One node with 2 CPUs in partition "distperf": a job of two 1-CPU tasks runs two node agents on it, each
# acting as one node of a 2-node torchrun job. Everything (config, munge key and socket, spool, logs, pid
# files) lives under $DISTPERF_SLURM_STATE, so nothing in /etc is changed; clients find the cluster through
# SLURM_CONF. Idempotent: start on a running cluster only prints the exports; stop on none does nothing.
set -euo pipefail

STATE="${DISTPERF_SLURM_STATE:-/tmp/distperf-slurm}"
PARTITION=distperf
CONF="$STATE/slurm.conf"
NODE="$(hostname -s)"

log() { echo "slurm.sh: $*" >&2; }

exports() {
  echo "export SLURM_CONF=$CONF"
  echo "export DISTPERF_TEST_SLURM_PARTITION=$PARTITION"
}

running() {
  [ -f "$CONF" ] && SLURM_CONF="$CONF" timeout 5 sinfo -h -p "$PARTITION" -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'
}

install_packages() {
  if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
      && command -v sinfo >/dev/null; then
    return
  fi
  [ "$(id -u)" = 0 ] || { log "not root: cannot install slurmctld, slurmd, munge"; exit 1; }
  log "installing slurmctld slurmd slurm-client munge (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq slurmctld slurmd slurm-client munge >&2
}

write_config() {
  mkdir -p "$STATE/ctld" "$STATE/spool" "$STATE/munge"
  chmod 700 "$STATE/munge"
  if [ ! -f "$STATE/munge/munge.key" ]; then
    dd if=/dev/urandom of="$STATE/munge/munge.key" bs=1024 count=1 status=none
    chmod 400 "$STATE/munge/munge.key"
  fi
  cat > "$CONF" <<EOF
ClusterName=distperf
SlurmctldHost=$NODE(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$STATE/munge/munge.socket
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldPort=${DISTPERF_SLURMCTLD_PORT:-6817}
SlurmdPort=${DISTPERF_SLURMD_PORT:-6818}
# No cgroups in a container: track processes by parentage, no task binding, no accounting daemon.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
# Fast turnaround for tests: a cancelled job's processes get SIGKILL 2 s after SIGTERM.
KillWait=2
MinJobAge=60
SlurmdTimeout=30
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=2 RealMemory=2048 State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=60 State=UP
EOF
}

start() {
  if running; then
    log "already running"
    exports
    return
  fi
  install_packages
  write_config
  if ! [ -S "$STATE/munge/munge.socket" ] || ! munge -n -S "$STATE/munge/munge.socket" >/dev/null 2>&1; then
    munged --force --key-file="$STATE/munge/munge.key" --socket="$STATE/munge/munge.socket" \
      --pid-file="$STATE/munge/munged.pid" --log-file="$STATE/munge/munged.log" \
      --seed-file="$STATE/munge/munged.seed" >&2
  fi
  export SLURM_CONF="$CONF"
  if ! { [ -f "$STATE/slurmctld.pid" ] && kill -0 "$(cat "$STATE/slurmctld.pid")" 2>/dev/null; }; then slurmctld -i >&2; fi
  if ! { [ -f "$STATE/slurmd.pid" ] && kill -0 "$(cat "$STATE/slurmd.pid")" 2>/dev/null; }; then slurmd -N "$NODE" >&2; fi
  for _ in $(seq 1 60); do
    if running; then
      log "node $NODE idle in partition $PARTITION"
      exports
      return
    fi
    sleep 1
  done
  log "the node did not become idle within 60 s; sinfo says:"
  sinfo -N -l >&2 || true
  tail -n 20 "$STATE/slurmctld.log" "$STATE/slurmd.log" >&2 || true
  stop
  exit 1
}

stop_pidfile() {
  local file="$1" pid
  [ -f "$file" ] || return 0
  pid="$(cat "$file")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}

stop() {
  if [ -f "$CONF" ] && command -v scancel >/dev/null; then
    SLURM_CONF="$CONF" timeout 10 scancel --partition="$PARTITION" 2>/dev/null || true
  fi
  # slurmd first (it ends the job steps it runs), then the controller, then munge.
  stop_pidfile "$STATE/slurmd.pid"
  stop_pidfile "$STATE/slurmctld.pid"
  stop_pidfile "$STATE/munge/munged.pid"
  rm -rf "$STATE"
  log "stopped"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
