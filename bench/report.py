"""What every benchmark script ends with: its JSON, with the machine it ran on, printed and saved."""
from __future__ import annotations

import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    mpi = subprocess.run(["mpirun", "--version"], capture_output=True, text=True).stdout.splitlines()
    import numpy
    import torch
    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(), "numpy": numpy.__version__,
            "torch": torch.__version__, "mpi": mpi[0] if mpi else "not found"}


def emit(report: dict, out: str | None) -> None:
    """Print the report (with the machine description) as JSON, and write it to `out` if given."""
    text = json.dumps({**report, "machine": machine()}, indent=2)
    print(text)
    if out:
        Path(out).write_text(text + "\n")


def median_seconds(fn, repeats: int = 7) -> float:
    """Median wall time of `repeats` calls: robust to the odd slow call on a shared machine."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def under_mpi(ranks: int, script: str, out: str | None) -> None:
    """Outside MPI, run `script` again under `mpirun -n ranks` (the project's wrapper) and exit
    with its status; inside MPI, return."""
    if "OMPI_COMM_WORLD_SIZE" in os.environ:
        return
    cmd = ["bash", str(REPO / "scripts/mpirun.sh"), "-n", str(ranks), sys.executable, script]
    sys.exit(subprocess.run(cmd + (["--out", out] if out else []), cwd=REPO).returncode)


def run_rate(config: str, ranks: int, seconds: float, out_dir: str, name: str, overrides: list[str],
             launcher: list[str] | None = None) -> dict:
    """Frames/s of a real run of `config` on `ranks` ranks (with `overrides`, KEY=VALUE), from its
    metrics.h5 after `seconds` of running, leaving out the first quarter of its updates (start-up);
    its updates per second and the fragments it dropped (async: older than algo.max_policy_lag)
    over the same window. The run is stopped with SIGUSR1: it checkpoints and exits 3 (preempted).
    `launcher`: the command before `python` (default: the project's mpirun wrapper with -n ranks)."""
    from hpcrl.io.metrics import read_metrics
    sets = [arg for kv in ["run.target_return=null", f"run.output_dir={out_dir}", f"run.name={name}",
                           "run.total_frames=100000000", "run.log_interval_s=1000", *overrides]
            for arg in ("--set", kv)]
    launcher = launcher or ["bash", str(REPO / "scripts/mpirun.sh"), "-n", str(ranks)]
    cmd = [*launcher, sys.executable, "-m", "hpcrl", "run", config, "--overwrite", *sets]
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(seconds + 6)  # start-up, then the measured window
    proc.send_signal(signal.SIGUSR1)  # mpirun forwards it
    output = proc.communicate(timeout=180)[0]
    m = read_metrics(os.path.join(out_dir, name, "metrics.h5"))
    frames, wall = m["frames"], m["wall_time"]
    if len(frames) < 8:
        raise RuntimeError(f"too few updates to measure ({len(frames)}):\n{output}")
    k = len(frames) // 4
    window = wall[-1] - wall[k]
    dropped = m["fragments_dropped"]
    return {"frames_per_s": float((frames[-1] - frames[k]) / window), "updates": int(len(frames)),
            "updates_per_s": float((len(frames) - 1 - k) / window),
            "fragments_dropped": int(dropped[-1] - dropped[k]), "exit_status": proc.returncode}
