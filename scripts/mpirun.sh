#!/usr/bin/env bash
# mpirun as this project's commands use it on a workstation or CI machine:
#  - Open MPI refuses to run as root unless told it is fine (containers, CI machines);
#  - --oversubscribe lets a job have more ranks than cores (idle hpcrl ranks sleep, not spin);
#  - SIGTERM and SIGINT (Ctrl-C) reach the ranks as SIGUSR1, which mpirun forwards to every rank:
#    hpcrl checkpoints and every rank exits 3, so this script does too. mpirun itself takes SIGTERM
#    and SIGINT as "abort": it kills the ranks a second later (odls_base_sigkill_timeout) and exits
#    1, before a checkpoint can be written. mpirun runs in a session of its own, so a Ctrl-C in the
#    terminal reaches only this script, which passes it on.
# On a cluster, call mpirun or srun directly (see README.md and jobs/*.sbatch).
set -uo pipefail
if [[ $(id -u) -eq 0 ]]; then
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
setsid mpirun --oversubscribe "$@" &
launcher=$!
trap 'kill -USR1 $launcher 2>/dev/null' USR1 TERM INT
# `wait` returns when a signal arrives: wait again until mpirun has really finished
wait $launcher; status=$?
while kill -0 $launcher 2>/dev/null; do wait $launcher; status=$?; done
exit $status
