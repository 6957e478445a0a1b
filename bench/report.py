"""What every benchmark script ends with: its JSON, with the machine it ran on, printed and saved."""
from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path


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
    import sys
    repo = Path(__file__).resolve().parents[1]
    cmd = ["bash", str(repo / "scripts/mpirun.sh"), "-n", str(ranks), sys.executable, script]
    sys.exit(subprocess.run(cmd + (["--out", out] if out else []), cwd=repo).returncode)
