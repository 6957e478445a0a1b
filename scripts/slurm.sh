#!/usr/bin/env bash
# A real single-node SLURM on this machine, for the tests that submit jobs/*.sbatch:
#   bash scripts/slurm.sh start    install (Debian's slurmctld, slurmd, slurm-client, munge) if
#                                  missing, write the config, start munged, slurmctld, slurmd
#   bash scripts/slurm.sh stop     stop the daemons (its own: by their pid files)
#   bash scripts/slurm.sh status   exit 0 when the node is up
#   bash scripts/slurm.sh prepare  only install SLURM and munge and start munged (scripts/cluster.sh
#                                  uses it for SLURM across emulated nodes)
#   bash scripts/slurm.sh settings print the slurm.conf lines both SLURMs share (scripts/cluster.sh too)
# The node is declared with 16 CPUs whatever the machine has (SlurmdParameters=config_overrides),
# so a 4- or 6-task job is accepted on a 2-core machine; mpirun inside a job uses the allocation.
set -euo pipefail

state=${HPCRL_SLURM_DIR:-/var/lib/hpcrl-slurm}
conf=/etc/slurm/slurm.conf
node=$(hostname -s)
log() { printf '[slurm] %s\n' "$*" >&2; }

node_up() {
    sinfo -h -n "$node" -o '%t' 2>/dev/null | grep -qE '^(idle|mix|alloc)'
}

install() {
    local missing=()
    for cmd in slurmctld slurmd sbatch munged; do command -v "$cmd" >/dev/null || missing+=("$cmd"); done
    (( ${#missing[@]} )) || return 0
    [[ $(id -u) -eq 0 ]] || { log "SLURM is missing and installing it needs root"; exit 1; }
    log "installing slurmctld slurmd slurm-client munge from Debian"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
}

settings() {  # what this single-node SLURM and the emulated cluster's (scripts/cluster_slurm.sh) share
    cat <<CONF
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
JobRequeue=1
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
MinJobAge=3600
KillWait=10
InactiveLimit=0
CONF
}

write_config() {
    mkdir -p "$state/ctld" "$state/d" /etc/slurm
    cat > "$conf" <<CONF
# Written by hpcrl's scripts/slurm.sh: a single-node test cluster.
ClusterName=hpcrl-test
SlurmctldHost=$node
StateSaveLocation=$state/ctld
SlurmdSpoolDir=$state/d
SlurmctldPidFile=$state/slurmctld.pid
SlurmdPidFile=$state/slurmd.pid
SlurmctldLogFile=$state/slurmctld.log
SlurmdLogFile=$state/slurmd.log
$(settings)
NodeName=$node CPUs=16 RealMemory=4096 State=UNKNOWN
PartitionName=debug Nodes=$node Default=YES MaxTime=INFINITE State=UP
CONF
}

prepare() {  # SLURM's packages, and munged (shared by every slurmctld and slurmd on this machine)
    install
    mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
    if [[ ! -s /etc/munge/munge.key ]]; then
        dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    fi
    chown -R munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge 2>/dev/null || true
    chmod 0400 /etc/munge/munge.key
    pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged 2>/dev/null || /usr/sbin/munged --force
}

running() {  # running PIDFILE: the daemon that wrote it is alive
    [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null
}

start() {
    prepare
    if node_up; then log "already running"; return 0; fi
    # slurmctld and slurmd find each other by this host name
    getent hosts "$node" >/dev/null || echo "127.0.0.1 $node" >> /etc/hosts
    write_config
    # by pid file, not by name: the emulated cluster's SLURM (scripts/cluster.sh) may run beside it
    running "$state/slurmctld.pid" || slurmctld -c
    running "$state/slurmd.pid" || slurmd -c
    for _ in $(seq 60); do
        if node_up; then log "node $node is up"; return 0; fi
        scontrol update nodename="$node" state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    log "SLURM did not come up; see $state/slurmctld.log and $state/slurmd.log"
    exit 1
}

stop() {
    local daemon
    for daemon in slurmd slurmctld; do
        running "$state/$daemon.pid" && kill "$(cat "$state/$daemon.pid")"
    done
    log "stopped"
}

case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) node_up ;;
    prepare) prepare ;;
    settings) settings ;;
    *) echo "usage: $0 start|stop|status|prepare|settings" >&2; exit 2 ;;
esac
