"""`hpcrl sbatch`: write a SLURM job script that fits a config's layout (no MPI).

The one template for every job script in jobs/: resources, core binding, the launcher line, and
the preemption protocol (SIGUSR1 before the time limit -> checkpoint -> exit 3 -> requeue ->
resume). The layout is planned for the requested nodes first, so a script is never written for a
layout that cannot fit.
"""
from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass

from hpcrl.core.config import Config, ConfigError
from hpcrl.core.layout import Layout, plan_layout, simulated_nodes
from hpcrl.core.policies import num_policies

LAUNCHERS = ("mpirun", "srun")
# SLURM's --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds
TIME_FORMAT = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?")
TIME_FORMATS = ("minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes or "
                "days-hours:minutes:seconds, e.g. 02:00:00 or 1-12:00:00")
# a partition or account name as SLURM knows them (several partitions: comma-separated); never
# a space, a quote or a `;`, which would end the #SBATCH line or reach the shell
SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")


@dataclass
class JobRequest:
    config_path: str
    nodes: int
    ntasks_per_node: int
    time: str = "01:00:00"
    launcher: str = "mpirun"
    partition: str | None = None
    account: str | None = None
    signal_lead_s: int = 120
    no_kill: bool = False  # self-healing: keep the allocation when a node fails, relaunch on the rest
    max_relaunches: int = 3
    overrides: tuple[str, ...] = ()  # --set KEY=VALUE: planned with, and passed to hpcrl run by the script
    stage: str | None = None  # --stage: the node-local directory to stage into ('': $SLURM_TMPDIR or /tmp)


def time_problem(text: str) -> str | None:
    """What is wrong with a SLURM --time value, or None."""
    found = TIME_FORMAT.fullmatch(text)
    if found is None:
        return "not one of SLURM's time formats"
    days, first, second, third = found.groups()
    if days is not None:  # days-hours[:minutes[:seconds]]
        named = (("hours", first, 23), ("minutes", second, 59), ("seconds", third, 59))
    elif third is not None:  # hours:minutes:seconds
        named = (("minutes", second, 59), ("seconds", third, 59))
    else:  # minutes[:seconds]
        named = (("seconds", second, 59),)
    return next((f"{name} {int(value)} is above {top}" for name, value, top in named
                 if value is not None and int(value) > top), None)


def check(request: JobRequest, cfg: Config) -> Layout:
    """The layout the job will get; a ConfigError for a request or layout that cannot work."""
    if request.nodes < 1:
        raise ConfigError(f"--nodes: expected >= 1, got {request.nodes}")
    if request.ntasks_per_node < 1:
        raise ConfigError(f"--ntasks-per-node: expected >= 1, got {request.ntasks_per_node}")
    if request.launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher: expected one of {', '.join(LAUNCHERS)}, got {request.launcher!r}")
    if problem := time_problem(request.time):
        raise ConfigError(f"--time: expected SLURM's {TIME_FORMATS}; got {request.time!r}: {problem}")
    for option, name in (("--partition", request.partition), ("--account", request.account)):
        if name is not None and not SLURM_NAME.fullmatch(name):
            raise ConfigError(f"{option}: expected a SLURM name (letters, digits, '_', '.', '+', '-'; several "
                              f"partitions comma-separated), got {name!r}")
    if request.stage and not os.path.isabs(request.stage):
        raise ConfigError(f"--stage: expected an absolute node-local directory such as /tmp or /dev/shm, got "
                          f"{request.stage!r}")
    if request.max_relaunches < 0:
        raise ConfigError(f"--max-relaunches: expected >= 0, got {request.max_relaunches}")
    world = request.nodes * request.ntasks_per_node
    members = cfg.population.members
    if members:  # each member runs the roles table on its block of ranks (launch/population.py)
        from hpcrl.core.members import population_problem
        if problem := population_problem(cfg, world):
            raise ConfigError(f"{problem} (--nodes x --ntasks-per-node)")
        world //= members
    return plan_layout(cfg.roles, world, simulated_nodes(world, request.ntasks_per_node),
                       policies=num_policies(cfg.policies))


def _launchers(request: JobRequest) -> tuple[str, str]:
    """The launcher line and the other one (as a comment). In a self-healing script they start
    hpcrl on the nodes in $nodes ($count of them), which shrink when a node is lost."""
    per_node = "${SLURM_NTASKS_PER_NODE}"
    if request.no_kill:
        mpirun_where = f'-n "$((count * {per_node}))" --host "${{nodes//,/:{per_node},}}:{per_node}"'
        srun_where = f'--nodes="$count" --nodelist="$nodes" --ntasks="$((count * {per_node}))" '
    else:
        mpirun_where, srun_where = '-n "${SLURM_NTASKS}"', ""
    # staged: each node's own copy, and -P keeps the working directory (the checkout, on the shared
    # file system) off the front of the import path; hpcrl still finds a user's modules there (cli.py)
    python = '"$PYTHON" -P' if request.stage is not None else "python"
    run = f'{python} -m hpcrl run "$CONFIG"{_sets(request)} "$@"'
    mpirun = (f'mpirun {mpirun_where} --map-by "ppr:{per_node}:node" '
              f'--bind-to "${{HPCRL_BIND:-core}}" {run}')
    # --kill-on-bad-exit=0: hpcrl ends every rank itself (the same status on every rank for its
    # verdicts, MPI_Abort on a failure); srun's kill of the ranks still leaving after the first
    # turned a config error's 2 (or a preemption's 3) into 137, which the script then misread
    srun = (f'srun --mpi=pmix --kill-on-bad-exit=0 {srun_where}--cpu-bind="${{HPCRL_CPU_BIND:-cores}}" '
            f'{run}')
    return (srun, mpirun) if request.launcher == "srun" else (mpirun, srun)


def _sets(request: JobRequest) -> str:
    """' --set KEY=VALUE' for each override the layout was planned with, quoted for the shell."""
    return "".join(f" --set {shlex.quote(item)}" for item in request.overrides)


# `wait` returns when a signal arrives, so wait again until the launcher has really finished
WAIT = """wait $launcher; status=$?
while kill -0 $launcher 2>/dev/null; do wait $launcher; status=$?; done"""

# What a script does with the run's exit status once no relaunch is due.
EPILOGUE = """if [[ $status -eq 3 ]]; then
    echo "hpcrl: preempted with a checkpoint; requeueing job ${SLURM_JOB_ID}"
    scontrol requeue "${SLURM_JOB_ID}"
    exit 0
fi
# 4: an output could not be written (a full disk): not requeued, since it would fail the same way;
# free space, then submit again to resume from the checkpoint the message names
exit $status"""


def _staging(request: JobRequest) -> str:
    """With --stage: the lines that pack the environment (once: reused while unchanged) and unpack
    it once per node, setting PYTHON to the staged interpreter every rank starts from."""
    if request.stage is None:
        return ""
    where = shlex.quote(request.stage) if request.stage else "${SLURM_TMPDIR:-/tmp}"
    return f"""
# Staging (--stage, docs/clusters.md): the environment is packed once into stage/ (reused while
# nothing in it changed) and unpacked once per node into node-local storage, so that every rank
# imports from its node's copy, not from the shared file system; a relaunch reuses the copies.
# (PYTHONPATH still comes first on the import path: keep hpcrl out of it.)
STAGE_DIR=${{HPCRL_STAGE_DIR:-{where}}}  # edit: node-local storage (/tmp, /dev/shm, $SLURM_TMPDIR)
ARCHIVE=$(python -m hpcrl stage pack -o "${{HPCRL_STAGE_ARCHIVES:-stage}}") || exit 2  # edit: where archives are kept
PYTHON=$(srun --nodes="$SLURM_NNODES" --ntasks="$SLURM_NNODES" --ntasks-per-node=1 \\
    python -m hpcrl stage unpack "$ARCHIVE" --to "$STAGE_DIR" | sort -u) || exit 2
"""


def _plain_body(launch: str, other: str) -> str:
    return f"""# one rank per core (HPCRL_BIND=none / HPCRL_CPU_BIND=none where ranks outnumber cores, e.g. tests)
{launch} &
launcher=$!
# forward the early-warning signal to the launcher, which passes it to every rank; `wait`
# returns when a signal arrives, so wait again until the launcher has really finished
trap 'kill -USR1 $launcher' USR1 TERM
{WAIT}
# the other launcher, if this one does not suit the site:
# {other}

{EPILOGUE}"""


def _self_healing_body(launch: str, other: str, max_relaunches: int) -> str:
    return f"""MAX_RELAUNCHES=${{HPCRL_MAX_RELAUNCHES:-{max_relaunches}}}  # edit: relaunches after lost nodes, per job

PROBE_S=${{HPCRL_PROBE_S:-20}}  # seconds a node may take to start a one-task step before it counts as lost

answering_nodes() {{  # the nodes of the comma-separated list $1 that start a one-task step within PROBE_S
    local node pids=() ok=() i=0
    for node in ${{1//,/ }}; do
        timeout -k 5 "$PROBE_S" srun --nodes=1 --ntasks=1 --nodelist="$node" --overlap true >/dev/null 2>&1 &
        pids+=($!)
    done
    for node in ${{1//,/ }}; do wait "${{pids[i]}}" && ok+=("$node"); i=$((i + 1)); done
    (IFS=,; echo "${{ok[*]}}")
}}

nodes=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)
relaunches=0
# forward the early-warning signal to the launcher, which passes it to every rank; `wait`
# returns when a signal arrives, so wait again until the launcher has really finished
trap 'kill -USR1 $launcher' USR1 TERM
while true; do
    count=$(($(tr -cd , <<<"$nodes" | wc -c) + 1))
    # one rank per core (HPCRL_BIND=none / HPCRL_CPU_BIND=none where ranks outnumber cores, e.g. tests)
    {launch} &
    launcher=$!
    {WAIT.replace(chr(10), chr(10) + "    ")}
    # the other launcher, if this one does not suit the site:
    # {other}

    # 0 done, 2 a config error, 3 preempted, 4 a full disk: the run's own verdicts, never relaunched
    [[ $status =~ ^(0|2|3|4)$ ]] && break
    left=$(answering_nodes "$nodes") lost=""
    for node in ${{nodes//,/ }}; do [[ ,$left, == *,$node,* ]] || lost+=${{lost:+,}}$node; done
    if [[ -z $lost ]]; then
        echo "hpcrl: the launcher ended with status $status and every node answers: a failure of the run, not of a node; not relaunched"
        break
    elif [[ -z $left ]]; then
        echo "hpcrl: the launcher ended with status $status and no node of the job answers; not relaunched"
        break
    elif ((relaunches >= MAX_RELAUNCHES)); then
        echo "hpcrl: node(s) $lost stopped answering; not relaunched: $relaunches relaunch(es) already (HPCRL_MAX_RELAUNCHES=$MAX_RELAUNCHES)"
        break
    fi
    relaunches=$((relaunches + 1))
    # SLURM books the lost node's step as running until it hears from that node again: the next
    # steps may share its CPUs (srun, and the srun that mpirun starts its daemons with)
    export SLURM_OVERLAP=1
    # hpcrl appends this to recovery.log in the run directory, with the checkpoint it resumes from
    export HPCRL_RELAUNCH="relaunch $relaunches of at most $MAX_RELAUNCHES by job ${{SLURM_JOB_ID}}: the launcher ended with status $status and node(s) $lost stopped answering; going on on $left"
    echo "hpcrl: $HPCRL_RELAUNCH"
    nodes=$left
done

{EPILOGUE}"""


def render(request: JobRequest, cfg: Config, layout: Layout) -> str:
    counts = f"{len(layout.learners)} learner, {len(layout.inference)} inference, {len(layout.envs)} env"
    if cfg.population.members:
        counts = f"{cfg.population.members} population members of {layout.world_size}: {counts} each"
    world = request.nodes * request.ntasks_per_node
    optional = "".join(f"#SBATCH --{key}={value}\n" for key, value in
                       (("partition", request.partition), ("account", request.account)) if value)
    gpus = any(getattr(cfg.roles, role).device == "cuda" for role in ("learner", "inference", "env"))
    gpu_line = "#SBATCH --gpus-per-node=1             # edit: GPUs per node (roles with device: cuda)\n" if gpus else ""
    launch, other = _launchers(request)
    options = "".join(f" --{key} {shlex.quote(value)}" for key, value in
                      (("partition", request.partition), ("account", request.account)) if value) + _sets(request)
    if request.no_kill:
        written_by = f"{options} --no-kill --max-relaunches {request.max_relaunches}"
        healing = (f"# Lost nodes: SLURM keeps the allocation (--no-kill) and this script relaunches hpcrl on the\n"
                   f"# nodes that still answer, at most {request.max_relaunches} times; the run resumes from its last "
                   f"checkpoint,\n# and each relaunch is appended to recovery.log in the run directory.\n")
        no_kill_line = "#SBATCH --no-kill                  # a lost node does not end the allocation (see the loop below)\n"
        body = _self_healing_body(launch, other, request.max_relaunches)
    else:
        written_by, healing, no_kill_line = options, "", ""
        body = _plain_body(launch, other)
    if request.stage is not None:
        written_by += f" --stage {shlex.quote(request.stage)}" if request.stage else " --stage"
    return f"""#!/bin/bash
# {cfg.env.id} {cfg.algo.name.upper()} on {request.nodes} node{'s' if request.nodes > 1 else ''} x {request.ntasks_per_node} MPI ranks = {world} ({counts}).
# Written by: hpcrl sbatch {request.config_path} --nodes {request.nodes} --ntasks-per-node {request.ntasks_per_node} --time {request.time} --launcher {request.launcher}{written_by}
# Submit from the repository root:  sbatch THIS_FILE [--set KEY=VALUE ...]  (extra arguments go to hpcrl run)
# Preemption: SLURM sends SIGUSR1 {request.signal_lead_s} s before the time limit; hpcrl writes a checkpoint
# and every rank exits with status 3; this script then requeues the job, and the requeued job
# resumes the same run directory from that checkpoint.
{healing}#SBATCH --job-name=hpcrl-{cfg.run.name}
#SBATCH --nodes={request.nodes}                    # edit: nodes (then check: hpcrl plan ... --ranks-per-node)
#SBATCH --ntasks-per-node={request.ntasks_per_node}          # edit: MPI ranks per node
#SBATCH --cpus-per-task=1
#SBATCH --time={request.time}              # edit: wall-clock limit
{gpu_line}{optional}#SBATCH --signal=B:USR1@{request.signal_lead_s}        # USR1 to this script before the limit (forwarded below)
#SBATCH --requeue
{no_kill_line}#SBATCH --open-mode=append         # a requeued job appends to the same output file
#SBATCH --output=%x-%j.out
set -uo pipefail

# edit: activate the environment that has hpcrl (conda env from environment.yml, or the set-up's .venv)
if [[ -f .venv/bin/activate ]]; then source .venv/bin/activate; fi
export OMP_NUM_THREADS=1           # one thread per rank: the ranks themselves are the parallelism
export MPICH_MAX_THREAD_SAFETY=multiple  # (Cray) MPICH: learners need MPI_THREAD_MULTIPLE for Horovod

CONFIG=${{CONFIG:-{shlex.quote(request.config_path)}}}
{_staging(request)}{body}
"""


def write_script(path: str, text: str) -> None:
    """The script at `path`, executable, written whole: to a temporary name beside it, then
    renamed over it, so a failed write (a full disk) leaves the old script or none, never half."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
