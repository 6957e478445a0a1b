"""What a rank's start-up asks of the file system its Python environment lives on (issue 47): the
metadata system calls (open, stat, access, readlink, directory listings) of each rank of a real
4-rank CartPole job (learner, inference, 2 env ranks), counted with strace, and split by where
their paths lie:

- `venv`: the virtual environment (torch, numpy, gymnasium, mpi4py, h5py, horovod ...);
- `checkout`: this repository (hpcrl's own modules and kernels, the config);
- `python`: the base interpreter's install (its standard library; pyenv, conda or /usr);
- `run_dir`: the run directory; `other`: /proc, /sys, /dev, /tmp, /etc and the like;
- `staged`: the node-local copy `hpcrl stage` made (tools/stage.py), in the second, staged run.

On a cluster the first three usually lie on the shared file system (Lustre, GPFS, NFS), whose
metadata server every user of the machine shares: at thousands of ranks their sum is what the
first minute of a job costs it. Each rank also reports its start-up seconds without strace (the
marks of metrics.h5, from a second, untraced run). strace is slow under ptrace: its counts are
exact, its times are not used.

    .venv/bin/python bench/startup.py [--out bench/results/startup.json]
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402

# the system calls that ask the metadata server (on Lustre: MDS round trips), by strace's names
METADATA_CALLS = ("open", "openat", "openat2", "stat", "lstat", "newfstatat", "statx", "access", "faccessat",
                  "faccessat2", "readlink", "readlinkat", "getdents64", "execve")
# 1 learner, 1 inference, 2 env ranks: the roles take the lowest ranks in this order
ROLES = {0: "learner", 1: "inference", 2: "env", 3: "env"}
CONFIG = REPO / "jobs" / "cartpole_ppo.yaml"
# strace -y prints a descriptor with its path: `openat(AT_FDCWD</work>, "x"`, `newfstatat(3</usr/lib>,
# "y"`, `getdents64(3</usr/lib>, `, `stat("/x"`; a line may start with the thread's id
TRACED_LINE = re.compile(r'^(?:\d+\s+)?(\w+)\((?:"([^"]*)"|(?:AT_FDCWD|\d+)<([^>]*)>(?:, "([^"]*)")?)')


def places() -> list[tuple[str, str]]:
    """(prefix, place) pairs, the most specific first: where each path a rank touches lies."""
    venv = sys.prefix
    python = sysconfig.get_config_var("prefix") if sys.prefix == sys.base_prefix else sys.base_prefix
    pairs = [(os.path.realpath(venv), "venv"), (venv, "venv"), (str(REPO), "checkout"),
             (os.path.realpath(python), "python"), (python, "python")]
    return sorted(set(pairs), key=lambda pair: -len(pair[0]))


def place_of(path: str, run_dir: str, prefixes: list[tuple[str, str]]) -> str:
    if path.startswith(run_dir):
        return "run_dir"
    return next((place for prefix, place in prefixes if path == prefix or path.startswith(prefix + "/")), "other")


def count(trace: Path, run_dir: str, prefixes: list[tuple[str, str]]) -> dict:
    """Metadata calls of one rank's trace (every thread and child it started), by place and by call."""
    by_place: collections.Counter = collections.Counter()
    by_call: collections.Counter = collections.Counter()
    for line in trace.read_text(errors="replace").splitlines():
        match = TRACED_LINE.match(line)
        if not match:
            continue
        call, path, base, name = match.groups()
        if call not in METADATA_CALLS:
            continue
        if path is None:  # a descriptor (the working directory's too), and perhaps a name relative to it
            if name == "":
                continue  # fstat of an open file (AT_EMPTY_PATH): no lookup by name
            path = base if name is None else name if name.startswith("/") else f"{base}/{name}"
        elif not path.startswith("/"):
            path = f"{REPO}/{path}"  # the job's working directory
        by_place[place_of(path, run_dir, prefixes)] += 1
        by_call[call] += 1
    shared = sum(by_place[p] for p in ("venv", "checkout", "python"))
    return {"metadata_calls": sum(by_place.values()), "shared": shared, "by_place": dict(by_place),
            "by_call": dict(by_call.most_common())}


def traced_run(work: Path, python: str, name: str, staged: str | None = None) -> dict[int, dict]:
    """The job once with `python`, each rank under strace; {rank: its counts}. `staged`: the
    staged copy's directory, whose paths count as 'staged'."""
    out = work / name
    calls = ",".join(METADATA_CALLS)
    rank_cmd = (f'exec strace -f -qq -y -s 4096 -e trace={calls} -o {work}/{name}$OMPI_COMM_WORLD_RANK.trace '
                f'{python} {"-P " if staged else ""}-m hpcrl run {CONFIG} --overwrite --set run.output_dir={out} '
                f'--set run.total_frames=1024 --set run.target_return=null')
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(["bash", str(REPO / "scripts/mpirun.sh"), "-n", "4", "bash", "-c", rank_cmd],
                          cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the traced run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    prefixes = sorted(places() + ([(staged, "staged")] if staged else []), key=lambda pair: -len(pair[0]))
    return {rank: count(work / f"{name}{rank}.trace", str(out), prefixes) for rank in ROLES}


def staged_python(work: Path) -> tuple[str, str, dict]:
    """This venv packed and unpacked as `hpcrl stage` does (tools/stage.py): (the staged
    interpreter, the staged copy's directory, the archive's size and the seconds each step took)."""
    import time

    import hpcrl
    from hpcrl.tools.stage import pack, staged_python as python_of, unpack
    start = time.perf_counter()
    archive, _ = pack(Path(sys.prefix), Path(hpcrl.__file__).parent, work / "archive")
    packed = time.perf_counter()
    target, _ = unpack(archive, work / "node")
    unpacked = time.perf_counter()
    return str(python_of(target)), str(target), {"archive_gib": round(archive.stat().st_size / 2**30, 2),
                                                 "pack_s": round(packed - start, 1),
                                                 "unpack_s": round(unpacked - packed, 1)}


def untraced_seconds(work: Path) -> dict[int, dict[str, float]]:
    """The job once more, without strace: each rank's seconds from its exec to the end of its
    imports and to its roles being built (metrics.h5's start-up marks)."""
    from hpcrl.io.metrics import read_startup
    out = work / "plain"
    done = subprocess.run(["bash", str(REPO / "scripts/mpirun.sh"), "-n", "4", sys.executable, "-m", "hpcrl", "run",
                           str(CONFIG), "--overwrite", "--set", f"run.output_dir={out}",
                           "--set", "run.total_frames=1024", "--set", "run.target_return=null"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the untraced run failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    marks = read_startup(str(out / "cartpole_ppo" / "metrics.h5"))
    return {rank: {name: round(float(seconds[rank]), 2) for name, seconds in marks.items()} for rank in ROLES}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="hpcrl-startup-") as tmp:
        work = Path(tmp)
        counts, seconds = traced_run(work, sys.executable, "shared"), untraced_seconds(work)
        python, target, staging = staged_python(work)
        staged = traced_run(work, python, "staged", target)
    ranks = {str(rank): {"role": role, "shared_venv": counts[rank], "staged_venv": staged[rank],
                         "startup_seconds": seconds[rank]} for rank, role in ROLES.items()}
    by_role = {}
    for role in dict.fromkeys(ROLES.values()):
        of_role = [rank for rank, r in ROLES.items() if r == role]
        by_role[role] = {f"{kind}_{key}": max(runs[rank][key] for rank in of_role)
                         for kind, runs in (("unstaged", counts), ("staged", staged))
                         for key in ("shared", "metadata_calls")}
    emit({"what": "metadata system calls per rank of a 4-rank CartPole PPO job (1,024 frames), by where their "
                  "paths lie; 'shared' = venv + checkout + python, what lies on a cluster's shared file system; "
                  "unstaged: ranks start from the venv, staged: from hpcrl stage's node-local copy",
          "venv": sys.prefix, "python": sys.base_prefix, "staging": staging, "by_role": by_role, "ranks": ranks},
         args.out)

if __name__ == "__main__":
    main()
