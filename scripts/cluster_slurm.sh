# SLURM across the emulated cluster's nodes; sourced by scripts/cluster.sh (its `up N --slurm`,
# `slurm CMD...` and `down`), not run by itself.
#
# slurmctld runs on this machine (the login node) in a UTS namespace named `ctl`, listening on the
# bridge's address at a port of the cluster's own; every node runs its own slurmd in its network
# namespace under its host name, with its spool, log and PMIx directories apart (TmpFS=.../%n), and
# all of them share this machine's munged through its socket. `cluster.sh slurm sbatch JOB` then
# submits as on a real cluster: the batch script runs on n0, and srun or mpirun inside the
# allocation starts ranks on every node over TCP. A node killed with `cluster.sh kill` loses its
# slurmd too; `cluster.sh up N --slurm` again starts it back.

slurm_dir=$state/slurm
slurm_conf=$slurm_dir/slurm.conf
# a node that stops answering is DOWN after this long; real sites use 300 s, a short one keeps
# tests and tries quick (hpcrl's own liveness does not wait for it)
SLURMD_TIMEOUT=${HPCRL_CLUSTER_SLURMD_TIMEOUT:-20}

slurm_port() {  # slurmctld's port: from the name's hash, moved on while something listens there
    local port=$((20000 + 0x${hash:0:4} % 20000))
    while ss -ltnH "sport = :$port" 2>/dev/null | grep -q .; do port=$((port + 1)); done
    echo "$port"
}

slurm_write_config() {
    local prefix n i
    prefix=$(cat "$state/prefix") n=$(count)
    mkdir -p "$slurm_dir/ctld"
    for ((i = 0; i < n; i++)); do mkdir -p "$slurm_dir/n$i/tmp"; done
    {
        cat <<CONF
# Written by hpcrl's scripts/cluster.sh: SLURM across the emulated cluster '$name'.
ClusterName=hpcrl-$hash
SlurmctldHost=ctl($prefix.254)
SlurmctldPort=$(slurm_port)
StateSaveLocation=$slurm_dir/ctld
SlurmctldPidFile=$slurm_dir/slurmctld.pid
SlurmctldLogFile=$slurm_dir/slurmctld.log
SlurmdSpoolDir=$slurm_dir/%n
SlurmdPidFile=$slurm_dir/%n/slurmd.pid
SlurmdLogFile=$slurm_dir/%n/slurmd.log
TmpFS=$slurm_dir/%n/tmp
SlurmdTimeout=$SLURMD_TIMEOUT
$(bash "$(dirname "${BASH_SOURCE[0]}")/slurm.sh" settings)
CONF
        for ((i = 0; i < n; i++)); do
            echo "NodeName=n$i NodeAddr=$prefix.$((i + 1)) CPUs=$(cat "$state/slots") RealMemory=4096 State=UNKNOWN"
        done
        echo "PartitionName=emulated Nodes=n[0-$((n - 1))] Default=YES MaxTime=INFINITE State=UP"
    } > "$slurm_conf"
}

pid_alive() { [[ -s $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

slurm_up() {
    bash "$(dirname "${BASH_SOURCE[0]}")/slurm.sh" prepare  # packages and munged
    [[ -f $slurm_conf ]] || slurm_write_config
    export SLURM_CONF=$slurm_conf
    if ! pid_alive "$slurm_dir/slurmctld.pid"; then
        # its own host name: slurmctld runs only where the host name is SlurmctldHost's
        unshare --uts sh -c 'hostname ctl && exec slurmctld -c' \
            || die "slurmctld did not start; see $slurm_dir/slurmctld.log"
    fi
    local node
    for node in $(nodes_list); do
        pid_alive "$slurm_dir/$node/slurmd.pid" || (exec_on "$node" slurmd -c) \
            || die "slurmd did not start on $node; see $slurm_dir/$node/slurmd.log"
    done
    for _ in $(seq 60); do
        if [[ $(sinfo -h -r -N -t idle,mix,alloc -o %N | wc -l) -eq $(count) ]]; then
            log "SLURM up: $(count) nodes (SLURM_CONF=$slurm_conf; cluster.sh slurm sbatch|srun|squeue|...)"
            return 0
        fi
        scontrol update nodename="n[0-$(($(count) - 1))]" state=resume >/dev/null 2>&1 || true
        sleep 1
    done
    die "SLURM's nodes did not come up: $(sinfo -h -N -o '%N %t' | tr '\n' ' '); see $slurm_dir/*.log"
}

slurm_down() {  # slurmctld; slurmd goes with its node's processes
    local pidfile
    for pidfile in "$slurm_dir"/slurmctld.pid "$slurm_dir"/n*/slurmd.pid; do
        pid_alive "$pidfile" && kill "$(cat "$pidfile")" 2>/dev/null
    done
    return 0
}

slurm_cmd() {  # slurm CMD...: a SLURM command (sbatch, srun, squeue, scontrol, ...) against this cluster
    [[ -f $slurm_conf ]] || die "cluster '$name' has no SLURM (bash scripts/cluster.sh up N --slurm)"
    SLURM_CONF=$slurm_conf exec "$@"
}
