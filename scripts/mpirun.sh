#!/usr/bin/env bash
# mpirun as this project's commands use it on a workstation or CI machine:
#  - Open MPI refuses to run as root unless told it is fine (containers, CI machines);
#  - --oversubscribe lets a job have more ranks than cores (idle hpcrl ranks sleep, not spin).
# On a cluster, call mpirun or srun directly (see README.md and jobs/*.sbatch).
set -euo pipefail
if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
exec mpirun --oversubscribe "$@"
