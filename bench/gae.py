"""The C kernels (src_ext/kernels.c) against the numpy reference at T=128, N=1024, as JSON.

Both run in this process on the same random fragment with episode ends and truncations; the
ratio is numpy time / C time (higher is better for C).

    .venv/bin/python bench/gae.py [--T 128] [--N 1024] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit, median_seconds  # noqa: E402
from hpcrl.algos import kernels  # noqa: E402
from tests.test_kernels import random_fragment  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--N", type=int, default=1024)
    parser.add_argument("--out")
    args = parser.parse_args()
    log_rhos, r, v, nxt, dones = random_fragment(args.T, args.N)
    cases = {"gae": lambda: kernels.gae(r, v, nxt, dones, 0.99, 0.95),
             "vtrace": lambda: kernels.vtrace(log_rhos, r, v, nxt, dones, 0.99, 1.0, 1.0, 1.0)}
    results = {}
    for name, fn in cases.items():
        os.environ["HPCRL_KERNELS"] = "c"
        c_ms = 1e3 * median_seconds(fn, repeats=21)
        os.environ["HPCRL_KERNELS"] = "numpy"
        numpy_ms = 1e3 * median_seconds(fn, repeats=21)
        results[name] = {"c_ms": round(c_ms, 3), "numpy_ms": round(numpy_ms, 3),
                         "speedup_c_vs_numpy": round(numpy_ms / c_ms, 1)}
    os.environ.pop("HPCRL_KERNELS")
    emit({"benchmark": "GAE and V-trace kernels", "T": args.T, "N": args.N, "backend_built": kernels.backend(),
          "results": results}, args.out)


if __name__ == "__main__":
    main()
