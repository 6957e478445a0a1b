#!/usr/bin/env bash
# An emulated cluster on this machine (root): nodes as network namespaces, each with its own host
# name (a UTS namespace per command) and an address on a bridge, TCP between them. Try a job's
# multi-node layout, its job script and its failures before spending an allocation.
#
#   bash scripts/cluster.sh up N [--slots S] [--slurm]
#                                              N nodes n0..n{N-1} (S slots each in the hostfile, default 4);
#                                              --slurm: with SLURM across them (slurmctld, a slurmd per node)
#   bash scripts/cluster.sh run ARGS...        mpirun from node n0 across the nodes, over TCP:
#                                              cluster.sh run -n 8 .venv/bin/python -m hpcrl run JOB.yaml
#   bash scripts/cluster.sh exec NODE CMD...   a command on a node (its network, host name and local storage
#                                              at /mnt: /var/tmp/hpcrl-cluster/NAME/NODE, its own)
#   bash scripts/cluster.sh kill NODE          every process on the node dies (kill -9): a node that fails
#   bash scripts/cluster.sh cut NODE           the node's link goes down: nothing crosses, no error arrives
#   bash scripts/cluster.sh heal NODE          its link comes back
#   bash scripts/cluster.sh slow NODE F        the node's processes get a fraction F of one core (cgroup cpu.max)
#   bash scripts/cluster.sh stop NODE          the node's processes freeze (cgroup freezer) until `cont NODE`
#   bash scripts/cluster.sh cont NODE          they run again, at full speed
#   bash scripts/cluster.sh slurm CMD...       a SLURM command against the cluster's SLURM, from this machine
#                                              (the login node): cluster.sh slurm sbatch --nodes 3 JOB.sbatch
#   bash scripts/cluster.sh nodes | hostfile | addr NODE | pids NODE | status
#   bash scripts/cluster.sh down               stop its SLURM, kill what runs on the nodes, remove every
#                                              namespace, link and cgroup the cluster made
#
# Several clusters may exist at once: HPCRL_CLUSTER (default "hpcrl") names one, and every kernel
# object it makes carries a short hash of that name (namespaces hpcrl-NAME-nI, bridge hbHASH, links
# hHASHnI), so tests give each run a name of its own. Every verb is idempotent: `up` on a cluster
# that is up checks it, `down` on one that is gone returns 0. State: /run/hpcrl-cluster/NAME.
#
# mpirun (Open MPI) reaches the nodes through an rsh agent written to the state folder (it runs the
# daemon's command inside the node), uses TCP between nodes and shared memory only inside one
# (btl tcp,self,vader, both restricted to the bridge's subnet), and binds no rank to a core (the
# nodes share this machine's cores); nothing else differs from a stock mpirun, so what a fault
# does here is what it does on a cluster.
set -euo pipefail

name=${HPCRL_CLUSTER:-hpcrl}
[[ $name =~ ^[A-Za-z0-9_.-]{1,40}$ ]] || { echo "cluster.sh: HPCRL_CLUSTER must be 1-40 of [A-Za-z0-9_.-], got '$name'" >&2; exit 2; }
hash=$(printf '%s' "$name" | sha256sum | cut -c1-6)
state=/run/hpcrl-cluster/$name
# each node's own storage (a disk's, not /run's memory: a staged environment is gigabytes), which
# its commands see at /mnt, as a cluster node sees its local scratch; everything else is shared
local_root=/var/tmp/hpcrl-cluster/$name
NODE_LOCAL_MOUNT=/mnt
bridge=hb$hash
cgroup_cpu=/sys/fs/cgroup/cpu/hpcrl-$name
cgroup_freezer=/sys/fs/cgroup/freezer/hpcrl-$name

# shellcheck source=scripts/cluster_slurm.sh
source "$(dirname "${BASH_SOURCE[0]}")/cluster_slurm.sh"

log() { printf '[cluster %s] %s\n' "$name" "$*" >&2; }
die() { log "$*"; exit 2; }

netns() { echo "hpcrl-$name-$1"; }       # a node's network namespace
hostlink() { echo "h${hash}${1}"; }       # the bridge's end of a node's link
count() { cat "$state/nodes" 2>/dev/null || echo 0; }

node_index() {  # n3 -> 3, refusing names the cluster does not have
    local node=$1 n
    n=$(count)
    [[ $node =~ ^n([0-9]+)$ ]] && (( BASH_REMATCH[1] < n )) \
        || die "no node '$node' in cluster '$name' (nodes: $(nodes_list | tr '\n' ' '))"
    echo "${BASH_REMATCH[1]}"
}

nodes_list() { local i; for ((i = 0; i < $(count); i++)); do echo "n$i"; done; }

subnet_prefix() {  # 10.A.B: from the name's hash, moved on while another interface has it
    local a=$((0x${hash:0:2} % 200 + 20)) b=$((0x${hash:2:2})) try
    for try in $(seq 0 255); do
        local prefix="10.$a.$(((b + try) % 256))"
        if ! ip -4 -o addr show | grep -q " $prefix\."; then echo "$prefix"; return; fi
    done
    die "no free 10.$a.x.0/24 subnet"
}

write_agent() {  # Open MPI's rsh agent: `agent HOST COMMAND...` runs COMMAND on node HOST
    cat > "$state/rsh" <<AGENT
#!/usr/bin/env bash
# Written by hpcrl's scripts/cluster.sh for cluster '$name': mpirun's rsh agent.
while [[ \${1:-} == -* ]]; do shift; done  # ssh-style options mpirun may pass
host=\$1; shift
exec bash "$(realpath "${BASH_SOURCE[0]}")" exec "\$host" sh -c "\$*"
AGENT
    chmod +x "$state/rsh"
}

install() {  # iproute2 (ip), util-linux (nsenter, unshare): on Debian images, but not on every one
    local missing=()
    command -v ip >/dev/null || missing+=(iproute2)
    command -v nsenter >/dev/null && command -v unshare >/dev/null || missing+=(util-linux)
    (( ${#missing[@]} )) || return 0
    log "installing from Debian: ${missing[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

up() {
    local n=$1 slots=$2 i node
    install
    (( n >= 1 && n <= 64 )) || die "up: expected 1-64 nodes, got $n"
    if [[ -f $state/nodes ]]; then
        [[ $(count) == "$n" ]] || die "cluster '$name' is up with $(count) nodes; run 'down' first"
        if check; then  # up again: every link up, every node running at full speed
            for node in $(nodes_list); do heal_node "$node" 2>/dev/null; cont_node "$node"; done
            log "already up: $n nodes"
            return 0
        fi
        log "cluster '$name' is damaged; rebuilding it"
        down
    fi
    mkdir -p "$state"
    local prefix
    prefix=$(subnet_prefix)
    echo "$prefix" > "$state/prefix"
    ip link add "$bridge" type bridge
    ip addr add "$prefix.254/24" dev "$bridge"
    ip link set "$bridge" up
    mkdir -p "$cgroup_cpu" "$cgroup_freezer"
    : > "$state/hostfile"
    for ((i = 0; i < n; i++)); do
        local ns link
        ns=$(netns "n$i") link=$(hostlink "n$i")
        ip netns add "$ns"
        ip link add "$link" type veth peer name eth0 netns "$ns"
        ip link set "$link" master "$bridge" up
        ip -n "$ns" addr add "$prefix.$((i + 1))/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        mkdir -p "$cgroup_cpu/n$i" "$cgroup_freezer/n$i"
        echo "n$i slots=$slots" >> "$state/hostfile"
    done
    echo "$n" > "$state/nodes"
    echo "$slots" > "$state/slots"
    write_agent
    log "up: $n nodes on $prefix.0/24 (bridge $bridge), hostfile $state/hostfile"
}

check() {  # every namespace, link and the bridge exist
    [[ -f $state/nodes ]] || return 1
    ip link show "$bridge" >/dev/null 2>&1 || return 1
    local node
    for node in $(nodes_list); do
        ip netns list | grep -qw "$(netns "$node")" || return 1
        ip link show "$(hostlink "$node")" >/dev/null 2>&1 || return 1
    done
}

node_pids() { ip netns pids "$(netns "$1")" 2>/dev/null || true; }

empty_node() {  # empty_node NODE: every process in its namespace dies (thawed first: a frozen one cannot)
    local node=$1 pids
    [[ -f $cgroup_freezer/$node/freezer.state ]] && echo THAWED > "$cgroup_freezer/$node/freezer.state"
    for _ in 1 2 3 4 5; do
        pids=$(node_pids "$node")
        [[ -z $pids ]] && return 0
        kill -9 $pids 2>/dev/null || true
        sleep 0.2
    done
}

kill_node() {
    node_index "$1" >/dev/null
    cont_node "$1"
    empty_node "$1"
    log "killed every process on $1"
}

exec_on() {  # exec NODE CMD...: in the node's network namespace, with its host name
    local node=$1; shift
    node_index "$node" >/dev/null
    [[ -e /run/netns/$(netns "$node") ]] || die "cluster '$name' has no node $node (bash scripts/cluster.sh up N)"
    # nsenter, not `ip netns exec`: that remounts /sys, which hides the cgroups from the node's own
    # commands (mpirun's rsh agent runs this again from inside node n0); a mount namespace of its
    # own (private: nothing leaks out) shows the node's local storage at /mnt
    mkdir -p "$local_root/$node"
    local enter='hostname "$0" && mount --bind "$1" "$2" && shift 2 && exec "$@"'
    exec nsenter --net="/run/netns/$(netns "$node")" unshare --uts --mount \
        sh -c "$enter" "$node" "$local_root/$node" "$NODE_LOCAL_MOUNT" "$@"
}

run() {  # mpirun on node n0 across every node, TCP between nodes
    check || die "cluster '$name' is not up (bash scripts/cluster.sh up N)"
    local subnet root_env=()
    subnet="$(cat "$state/prefix").0/24"
    [[ $(id -u) -ne 0 ]] || root_env=(env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
    # --bind-to none: the nodes share this machine's cores, and Open MPI binds each node's ranks
    # from core 0 up, so one rank per node put them all on one core (8 ms round trips, not 14 us)
    exec_on n0 "${root_env[@]}" mpirun --oversubscribe --bind-to none --hostfile "$state/hostfile" \
        --mca plm_rsh_agent "$state/rsh" \
        --mca btl tcp,self,vader --mca btl_tcp_if_include "$subnet" --mca oob_tcp_if_include "$subnet" \
        "$@"
}

cut_node() { ip link set "$(hostlink "$1")" down; log "cut $1 off (its link is down)"; }
heal_node() {
    ip link set "$(hostlink "$1")" up
    # addresses that went unanswered during the cut are cached as unreachable (connect() fails at
    # once with EHOSTUNREACH until the kernel probes again): forget them on every node
    local node
    for node in $(nodes_list); do ip -n "$(netns "$node")" neigh flush all 2>/dev/null || true; done
    log "healed $1 (its link is up)"
}

# A node's processes join its cgroups only while a fault lasts: kept there all the time, the
# cgroup hierarchy's group scheduling left sleeping threads unscheduled for up to 13 s on 2 cores
# (against 20 ms without), which no real node does. Processes the node starts later are not slowed.
move_pids() {  # move_pids NODE CGROUP_DIR: every process of the node into that cgroup
    local pid
    for pid in $(node_pids "$1"); do echo "$pid" > "$2/cgroup.procs" 2>/dev/null || true; done
}

slow_node() {  # a fraction of one core for every process on the node (cgroup v1 cpu quota)
    local node=$1 fraction=$2 quota
    quota=$(awk -v f="$fraction" 'BEGIN { if (f + 0 <= 0 || f + 0 > 64) exit 1; printf "%d", f * 100000 }') \
        || die "slow: expected a fraction of a core in (0, 64], got '$fraction'"
    (( quota >= 1000 )) || quota=1000
    echo 100000 > "$cgroup_cpu/$node/cpu.cfs_period_us"
    echo "$quota" > "$cgroup_cpu/$node/cpu.cfs_quota_us"
    move_pids "$node" "$cgroup_cpu/$node"
    log "$node runs on $fraction of a core"
}

stop_node() {
    move_pids "$1" "$cgroup_freezer/$1"
    echo FROZEN > "$cgroup_freezer/$1/freezer.state"
    log "$1 is stopped (frozen)"
}

cont_node() {  # thawed, at full speed, and out of the fault's cgroups
    if [[ -d $cgroup_freezer/$1 ]]; then
        echo THAWED > "$cgroup_freezer/$1/freezer.state"
        move_pids "$1" /sys/fs/cgroup/freezer
    fi
    if [[ -d $cgroup_cpu/$1 ]]; then
        echo -1 > "$cgroup_cpu/$1/cpu.cfs_quota_us"
        move_pids "$1" /sys/fs/cgroup/cpu
    fi
    return 0
}

down() {
    local ns node
    slurm_down
    # every namespace of this cluster, also those an interrupted `up` or `down` left; a node's
    # link goes with its namespace
    for ns in $(ip netns list | awk '{print $1}' | grep "^hpcrl-$name-n[0-9]*$" || true); do
        node=${ns##*-}
        empty_node "$node"
        ip netns del "$ns" 2>/dev/null || true
    done
    ip link del "$bridge" 2>/dev/null || true
    local group
    for group in "$cgroup_cpu" "$cgroup_freezer"; do
        [[ -d $group ]] || continue
        for sub in "$group"/n*/; do
            [[ -d $sub ]] || continue
            [[ -f $sub/freezer.state ]] && echo THAWED > "$sub/freezer.state"
            rmdir "$sub" 2>/dev/null || true
        done
        rmdir "$group" 2>/dev/null || true
    done
    rm -rf "$state" "$local_root"
    rmdir "${local_root%/*}" 2>/dev/null || true  # (another cluster's may still be there)
    log "down"
}

[[ $(id -u) -eq 0 ]] || die "network namespaces need root"
verb=${1:-}
(( $# )) && shift
case "$verb" in
    up)
        n=${1:-}; shift || true
        slots=4 with_slurm=0
        while (( $# )); do
            case $1 in
                --slots) slots=${2:?--slots needs a number}; shift 2 ;;
                --slurm) with_slurm=1; shift ;;
                *) die "up: unknown option '$1' (usage: cluster.sh up N [--slots S] [--slurm])" ;;
            esac
        done
        [[ $n =~ ^[0-9]+$ && $slots =~ ^[0-9]+$ ]] || die "usage: cluster.sh up N [--slots S] [--slurm]"
        up "$n" "$slots"
        (( ! with_slurm )) || slurm_up ;;
    slurm) (( $# )) || die "usage: cluster.sh slurm CMD... (sbatch, srun, squeue, sinfo, scontrol, scancel)"
        slurm_cmd "$@" ;;
    run) run "$@" ;;
    exec) (( $# >= 2 )) || die "usage: cluster.sh exec NODE CMD..."; exec_on "$@" ;;
    kill) kill_node "${1:?kill NODE}" ;;
    cut) node_index "${1:?cut NODE}" >/dev/null; cut_node "$1" ;;
    heal) node_index "${1:?heal NODE}" >/dev/null; heal_node "$1" ;;
    slow) node_index "${1:?slow NODE FRACTION}" >/dev/null; slow_node "$1" "${2:?slow NODE FRACTION}" ;;
    stop) node_index "${1:?stop NODE}" >/dev/null; stop_node "$1" ;;
    cont) node_index "${1:?cont NODE}" >/dev/null; cont_node "$1"; log "$1 runs again" ;;
    nodes) nodes_list ;;
    hostfile) check || die "cluster '$name' is not up"; echo "$state/hostfile" ;;
    addr) echo "$(cat "$state/prefix").$(($(node_index "${1:?addr NODE}") + 1))" ;;
    pids) node_index "${1:?pids NODE}" >/dev/null; node_pids "$1" ;;
    status) check && { log "up: $(count) nodes"; exit 0; }; log "not up"; exit 1 ;;
    down) down ;;
    *) sed -n '2,22p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
