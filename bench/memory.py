"""Resident memory of an env rank that uses remote inference (no torch) against one that runs its
policy inline (torch, the model), measured in the same run, as JSON.

Each case is a fresh Python process that imports what that rank imports and builds its env vector
(and policy); its VmRSS is read at the end.

    .venv/bin/python bench/memory.py [--out FILE]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402

COMMON = """
import sys
from hpcrl.runtime import comm
from hpcrl.core.config import parse_config
from hpcrl.envs import make_vector_env, env_spaces
import hpcrl.workers.env_rank
cfg = parse_config("env: {id: CartPole-v1, num_envs: 8}")
envs, obs = make_vector_env(cfg.env, seed=0)
"""
INLINE = """
from hpcrl.models import PolicyRunner, build_model
spaces = env_spaces(cfg.env)
runner = PolicyRunner(build_model(spaces, cfg.model), "cpu", seed=0)
"""
REPORT = """
rss = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS"))
print(rss, "torch" in sys.modules)
"""


def rss_kib(code: str) -> tuple[int, bool]:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    rss, torch_loaded = out.stdout.split()
    return int(rss), torch_loaded == "True"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out")
    args = parser.parse_args()
    remote, remote_torch = rss_kib(COMMON + REPORT)
    inline, inline_torch = rss_kib(COMMON + INLINE + REPORT)
    assert not remote_torch and inline_torch
    emit({"benchmark": "env rank resident memory (CartPole-v1 x 8)",
          "remote_inference_env_rank_mib": round(remote / 1024, 1),
          "inline_inference_env_rank_mib": round(inline / 1024, 1),
          "saved_per_env_rank_mib": round((inline - remote) / 1024, 1),
          "ratio_inline_to_remote": round(inline / remote, 2)}, args.out)


if __name__ == "__main__":
    main()
