"""`hpcrl sbatch`: write a SLURM job script that fits a config's layout (no MPI).

The one template for every job script in jobs/: resources, core binding, the launcher line, and
the preemption protocol (SIGUSR1 before the time limit -> checkpoint -> exit 3 -> requeue ->
resume). The layout is planned for the requested nodes first, so a script is never written for a
layout that cannot fit.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from hpcrl.core.config import Config, ConfigError
from hpcrl.core.layout import Layout, plan_layout, simulated_nodes
from hpcrl.core.policies import num_policies

LAUNCHERS = ("mpirun", "srun")
TIME_FORMAT = re.compile(r"^(\d+-)?\d{1,2}(:\d{2}){0,2}$")


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


def check(request: JobRequest, cfg: Config) -> Layout:
    """The layout the job will get; a ConfigError for a request or layout that cannot work."""
    if request.nodes < 1:
        raise ConfigError(f"--nodes: expected >= 1, got {request.nodes}")
    if request.ntasks_per_node < 1:
        raise ConfigError(f"--ntasks-per-node: expected >= 1, got {request.ntasks_per_node}")
    if request.launcher not in LAUNCHERS:
        raise ConfigError(f"--launcher: expected one of {', '.join(LAUNCHERS)}, got {request.launcher!r}")
    if not TIME_FORMAT.match(request.time):
        raise ConfigError(f"--time: expected SLURM's [D-]HH:MM:SS (e.g. 02:00:00), got {request.time!r}")
    world = request.nodes * request.ntasks_per_node
    return plan_layout(cfg.roles, world, simulated_nodes(world, request.ntasks_per_node),
                       policies=num_policies(cfg.policies))


def render(request: JobRequest, cfg: Config, layout: Layout) -> str:
    counts = f"{len(layout.learners)} learner, {len(layout.inference)} inference, {len(layout.envs)} env"
    world = request.nodes * request.ntasks_per_node
    optional = "".join(f"#SBATCH --{key}={value}\n" for key, value in
                       (("partition", request.partition), ("account", request.account)) if value)
    gpus = any(getattr(cfg.roles, role).device == "cuda" for role in ("learner", "inference", "env"))
    gpu_line = "#SBATCH --gpus-per-node=1             # edit: GPUs per node (roles with device: cuda)\n" if gpus else ""
    mpirun = ('mpirun -n "${SLURM_NTASKS}" --map-by "ppr:${SLURM_NTASKS_PER_NODE}:node" '
              '--bind-to "${HPCRL_BIND:-core}" python -m hpcrl run "$CONFIG" "$@"')
    srun = ('srun --mpi=pmix --kill-on-bad-exit=1 --cpu-bind="${HPCRL_CPU_BIND:-cores}" '
            'python -m hpcrl run "$CONFIG" "$@"')
    launch, other = (srun, mpirun) if request.launcher == "srun" else (mpirun, srun)
    return f"""#!/bin/bash
# {cfg.env.id} {cfg.algo.name.upper()} on {request.nodes} node{'s' if request.nodes > 1 else ''} x {request.ntasks_per_node} MPI ranks = {world} ({counts}).
# Written by: hpcrl sbatch {request.config_path} --nodes {request.nodes} --ntasks-per-node {request.ntasks_per_node} --time {request.time} --launcher {request.launcher}
# Submit from the repository root:  sbatch THIS_FILE [--set KEY=VALUE ...]  (extra arguments go to hpcrl run)
# Preemption: SLURM sends SIGUSR1 {request.signal_lead_s} s before the time limit; hpcrl writes a checkpoint
# and every rank exits with status 3; this script then requeues the job, and the requeued job
# resumes the same run directory from that checkpoint.
#SBATCH --job-name=hpcrl-{cfg.run.name}
#SBATCH --nodes={request.nodes}                    # edit: nodes (then check: hpcrl plan ... --ranks-per-node)
#SBATCH --ntasks-per-node={request.ntasks_per_node}          # edit: MPI ranks per node
#SBATCH --cpus-per-task=1
#SBATCH --time={request.time}              # edit: wall-clock limit
{gpu_line}{optional}#SBATCH --signal=B:USR1@{request.signal_lead_s}        # USR1 to this script before the limit (forwarded below)
#SBATCH --requeue
#SBATCH --open-mode=append         # a requeued job appends to the same output file
#SBATCH --output=%x-%j.out
set -uo pipefail

# edit: activate the environment that has hpcrl (conda env from environment.yml, or the set-up's .venv)
if [[ -f .venv/bin/activate ]]; then source .venv/bin/activate; fi
export OMP_NUM_THREADS=1           # one thread per rank: the ranks themselves are the parallelism
export MPICH_MAX_THREAD_SAFETY=multiple  # (Cray) MPICH: learners need MPI_THREAD_MULTIPLE for Horovod

CONFIG=${{CONFIG:-{request.config_path}}}
# one rank per core (HPCRL_BIND=none / HPCRL_CPU_BIND=none where ranks outnumber cores, e.g. tests)
{launch} &
launcher=$!
# forward the early-warning signal to the launcher, which passes it to every rank; `wait`
# returns when a signal arrives, so wait again until the launcher has really finished
trap 'kill -USR1 $launcher' USR1 TERM
wait $launcher; status=$?
while kill -0 $launcher 2>/dev/null; do wait $launcher; status=$?; done
# the other launcher, if this one does not suit the site:
# {other}

if [[ $status -eq 3 ]]; then
    echo "hpcrl: preempted with a checkpoint; requeueing job ${{SLURM_JOB_ID}}"
    scontrol requeue "${{SLURM_JOB_ID}}"
    exit 0
fi
# 4: an output could not be written (a full disk): not requeued, since it would fail the same way;
# free space, then submit again to resume from the checkpoint the message names
exit $status
"""
