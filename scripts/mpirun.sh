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
# Open MPI follows any non-zero exit with two boxed notices on stderr ("Primary job terminated
# normally, but 1 process returned a non-zero exit code..." and "mpirun detected that one or more
# processes exited with non-zero status..."), 11 lines under hpcrl's own one. Once a rank has said
# why the job ends (a line "hpcrl: ..."), they say nothing more and are left out; every other
# notice (a rank killed by a signal, a node lost) still shows. The filter ignores the terminal's
# signals, so a Ctrl-C never cuts the pipe that mpirun writes its stderr to.
notices=$(mktemp -u "${TMPDIR:-/tmp}/hpcrl-mpirun.XXXXXX")
mkfifo -m 600 "$notices"
trap 'rm -f "$notices"' EXIT
(trap '' INT TERM USR1; exec awk '
    function flush_box() { printf "%s", box > "/dev/stderr"; fflush("/dev/stderr"); box = ""; inbox = 0 }
    /^hpcrl: / { said = 1 }
    /^--------------------+$/ {
        if (!inbox) { box = $0 "\n"; inbox = 1; next }
        box = box $0 "\n"
        if (said && (box ~ /\nPrimary job +terminated normally, but/ ||
                     box ~ /\nmpirun detected that one or more processes exited with non-zero status/)) {
            box = ""; inbox = 0
        } else flush_box()
        next
    }
    inbox { box = box $0 "\n"; next }
    { print > "/dev/stderr"; fflush("/dev/stderr") }
    END { if (inbox) flush_box() }
' <"$notices") &
filter=$!
setsid mpirun --oversubscribe "$@" 2>"$notices" &
launcher=$!
trap 'kill -USR1 $launcher 2>/dev/null' USR1 TERM INT
# `wait` returns when a signal arrives: wait again until mpirun has really finished
wait $launcher; status=$?
while kill -0 $launcher 2>/dev/null; do wait $launcher; status=$?; done
wait $filter
exit $status
