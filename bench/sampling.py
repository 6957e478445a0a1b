"""Sampling throughput: env (+ inference) ranks run the policy while the learner takes fragments
without training (algo.train: false, async mode, so nobody waits for weights), as JSON.

The baseline, measured in the same run around each layout (before and after it, the mean of the
two): one process stepping the same vector of envs with the same policy forward in a tight loop
(no MPI, no fragments). For each layout

    ratio          = hpcrl frames/s / (baseline frames/s x sampling processes)      (target >= 0.8)
    ratio_per_core = hpcrl frames/s / (baseline frames/s x min(sampling processes, cores left))

where sampling processes are the env ranks plus the inference ranks, and cores left are the
machine's cores minus the learner's. On a machine with fewer cores than ranks the first ratio
measures oversubscription as much as hpcrl; the second is what the hardware allows.

    .venv/bin/python bench/sampling.py [--config jobs/cartpole_appo.yaml] [--seconds 12] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402

# name, world size, roles, sampling processes (env + inference ranks)
LAYOUTS = [
    ("inline: 1 learner + 2 env ranks", 3, "{learner: {ranks: 1}, inference: {ranks: 0}, env: {ranks: 2}}", 2),
    ("remote: 1 learner + 1 inference + 2 env ranks", 4,
     "{learner: {ranks: 1}, inference: {ranks: 1}, env: {ranks: 2}}", 3),
]


def tight_loop(config: str, seconds: float) -> float:
    """Frames/s of one process: policy forward, then env step, on one vector of the config's size."""
    import numpy as np
    import torch

    from hpcrl.core.config import load_config
    from hpcrl.envs import make_vector_env, probe_spaces
    from hpcrl.models import PolicyRunner, build_model
    cfg, _ = load_config(config)
    torch.set_num_threads(cfg.run.torch_threads)
    spaces = probe_spaces(cfg.env)
    envs, obs = make_vector_env(cfg.env, seed=0)
    runner = PolicyRunner(build_model(spaces, cfg.model), "cpu", seed=0)
    n = cfg.env.num_envs
    actions = np.zeros((n, *spaces.action_shape), dtype=spaces.action_dtype)
    out = {"actions": actions, "logp": np.zeros(n, np.float32), "values": np.zeros(n, np.float32)}
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(50):
            runner.act(obs, out)
            obs = envs.step(actions)[0]
        steps += 50
    elapsed = time.perf_counter() - start
    envs.close()
    return steps * n / elapsed


def hpcrl_rate(config: str, ranks: int, roles: str, seconds: float, out_dir: str) -> dict:
    """Frames/s of a real run, from its metrics.h5, leaving out the first quarter (start-up)."""
    from hpcrl.io.metrics import read_metrics
    name = f"sampling{ranks}"
    cmd = ["bash", str(REPO / "scripts/mpirun.sh"), "-n", str(ranks), sys.executable, "-m", "hpcrl", "run", config,
           "--overwrite", "--set", "algo.mode=async", "--set", "algo.train=false", "--set", f"roles={roles}",
           "--set", "run.target_return=null", "--set", f"run.output_dir={out_dir}", "--set", f"run.name={name}",
           "--set", "run.total_frames=100000000", "--set", "run.log_interval_s=1000"]
    proc = subprocess.Popen(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(seconds + 6)  # start-up, then the measured window
    proc.send_signal(signal.SIGUSR1)  # mpirun forwards it: the run checkpoints and exits 3 (preempted)
    output = proc.communicate(timeout=120)[0]
    m = read_metrics(os.path.join(out_dir, name, "metrics.h5"))
    frames, wall = m["frames"], m["wall_time"]
    if len(frames) < 8:
        raise RuntimeError(f"too few updates to measure ({len(frames)}):\n{output}")
    k = len(frames) // 4
    return {"frames_per_s": float((frames[-1] - frames[k]) / (wall[-1] - wall[k])), "updates": int(len(frames)),
            "exit_status": proc.returncode}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(REPO / "jobs/cartpole_appo.yaml"))
    parser.add_argument("--seconds", type=float, default=12.0, help="measured seconds per case")
    parser.add_argument("--out", help="write the JSON here too")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    layouts = []
    # The tight loop runs right before and right after each layout, and the layout is set against
    # the mean of the two: on a shared machine the speed of a core drifts by a third within
    # minutes, and a baseline taken once at the start would put that drift into the ratios.
    loops = [tight_loop(args.config, args.seconds / 2)]
    with tempfile.TemporaryDirectory() as tmp:
        for name, ranks, roles, sampling in LAYOUTS:
            rate = hpcrl_rate(args.config, ranks, roles, args.seconds, tmp)
            loops.append(tight_loop(args.config, args.seconds / 2))
            baseline = (loops[-2] + loops[-1]) / 2
            usable = max(1, min(sampling, cores - 1))
            layouts.append({"layout": name, "world_size": ranks, "sampling_processes": sampling, **rate,
                            "tight_loop_frames_per_s": round(baseline, 1),
                            "ratio": round(rate["frames_per_s"] / (baseline * sampling), 3),
                            "ratio_per_core": round(rate["frames_per_s"] / (baseline * usable), 3)})
    emit({"benchmark": "sampling", "config": os.path.relpath(args.config, REPO),
          "tight_loop_runs_frames_per_s": [round(x, 1) for x in loops], "layouts": layouts, "target_ratio": 0.8},
         args.out)


if __name__ == "__main__":
    main()
