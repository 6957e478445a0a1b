"""Sync PPO's update at CartPole scale against Stable-Baselines3's `PPO.train()`, as JSON.

The batch is jobs/cartpole_ppo.yaml's: 2 env ranks x 8 envs x rollout 32 = 512 frames, 20 epochs
of 2 minibatches of 256, the 64x64 tanh MLP, Adam with a linear learning-rate schedule,
max_grad_norm 0.5, torch threads 1. hpcrl: the trainer's own step (algos/ppo.py: PPOStep, with
the network of hpcrl.models.build_policy and the optimizer of build_optimizer) on two real
CartPole fragments, collected by an env rank with an inline policy in this process
(launch/solo.py); one call is what the trainer does per update (the learning rate of the
schedule, fragments -> GAE -> the minibatch-epoch update). It runs with the plain optimizer (one
learner without Horovod) and with the trainer's averaging wrapper (Horovod's DistributedOptimizer
and the trainer's hooks, workers/trainer.py) at world size 1, which is why this script starts
itself under `mpirun -n 1`. SB3 2.9.2 PPO: 16 envs x n_steps 32 (the same 512 frames), batch
size 256, 20 epochs, the same learning rate, clipping and gradient norm; its rollout buffer is
filled by a real `collect_rollouts` and restored (unflattened) before every timed `train()`, so
each call flattens it once and turns it into minibatch tensors as a real update does.

All cases run in this process, one call of each in turn for `--repeats` rounds; the figures are
medians, per update and per frame; `ratio_to_sb3` = hpcrl / SB3 (below 1: hpcrl is faster).

    .venv/bin/python bench/update.py [--repeats 41] [--out FILE] [--no-horovod]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from report import emit  # noqa: E402

CONFIG = REPO / "jobs/cartpole_ppo.yaml"
ENV_RANKS = 2  # the job's env ranks: their fragments make one update's batch


def real_fragments(cfg, spaces, count: int) -> list[dict]:
    """`count` consecutive sync-mode fragments of one env rank of `cfg` (its inline policy, a
    fresh network), copied out of the receiver's slots."""
    import torch

    from hpcrl.launch.solo import solo_actor
    torch.manual_seed(cfg.run.seed)
    fed = solo_actor(cfg, spaces)
    got = []
    fed.records(count, 100 * cfg.algo.rollout_length * count,
                lambda r: got.append(_Fragment({name: array.copy() for name, array in r.arrays.items()})),
                version_due=lambda actor: actor.version_fragments == 0)
    fed.close()
    if len(got) < count:
        raise RuntimeError(f"{len(got)} of {count} fragments arrived")
    return got


class _Fragment:
    """A received fragment's arrays, as PPOStep reads them."""

    def __init__(self, arrays: dict):
        self.arrays = arrays

    def __getitem__(self, name):
        return self.arrays[name]


def hpcrl_update(cfg, spaces, fragments, averaging: bool):
    """One trainer update per call: the trainer's own pieces, with or without Horovod's wrapper."""
    import numpy as np
    import torch

    from hpcrl.algos.ppo import PPOStep
    from hpcrl.models import build_optimizer, build_policy
    torch.manual_seed(cfg.run.seed)
    model = build_policy(spaces, cfg)
    optimizer = build_optimizer(model, cfg)
    if averaging:
        from hpcrl.workers.averaging import averaging_hooks, averaging_optimizer
        optimizer = averaging_optimizer(model, optimizer)
        hooks = averaging_hooks(optimizer)
    else:  # one learner without Horovod: the optimizer's own step
        hooks = {"apply_step": optimizer.step}
    step = PPOStep(cfg, model, optimizer, torch.device("cpu"), np.random.default_rng(0), spaces.obs_dtype,
                   spaces.action_dtype)
    a, frames = cfg.algo, [0]

    def call():
        for group in optimizer.param_groups:  # the trainer's linear schedule (workers/trainer.py: _update)
            group["lr"] = a.lr * max(0.0, 1.0 - frames[0] / cfg.run.total_frames)
        step(fragments, **hooks)
        frames[0] += 1  # keeps the rate nearly constant over the repeats
    return call


def sb3_train(cfg, frames: int):
    """SB3 PPO's `train()` on a rollout buffer of `frames` frames filled by `collect_rollouts`;
    before each call (outside the timing) the buffer is put back as collected."""
    import numpy as np
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.utils import LinearSchedule
    a = cfg.algo
    n_envs = frames // a.rollout_length
    model = PPO("MlpPolicy", make_vec_env(cfg.env.id, n_envs=n_envs, seed=cfg.run.seed), n_steps=a.rollout_length,
                batch_size=frames // a.num_minibatches, n_epochs=a.epochs, gamma=a.gamma, gae_lambda=a.gae_lambda,
                ent_coef=a.ent_coef, learning_rate=LinearSchedule(a.lr, 0.0, 1.0), clip_range=a.clip_coef,
                max_grad_norm=a.max_grad_norm, policy_kwargs=dict(net_arch=list(cfg.model.hidden_sizes)),
                device="cpu", seed=cfg.run.seed, verbose=0)
    _, callback = model._setup_learn(cfg.run.total_frames, callback=None)
    callback.on_training_start(locals(), globals())
    if not model.collect_rollouts(model.env, callback, model.rollout_buffer, n_rollout_steps=model.n_steps):
        raise RuntimeError("SB3's collect_rollouts stopped early")
    buffer = model.rollout_buffer
    names = ("observations", "actions", "rewards", "returns", "episode_starts", "values", "log_probs", "advantages")
    collected = {name: getattr(buffer, name).copy() for name in names}

    def restore():
        for name in names:
            setattr(buffer, name, collected[name].copy())
        buffer.generator_ready = False
    return model.train, restore, {"n_envs": n_envs, "n_steps": model.n_steps, "batch_size": model.batch_size,
                                  "n_epochs": model.n_epochs, "buffer_frames": int(np.prod(collected["rewards"].shape))}


def measure(repeats: int, horovod: bool) -> dict:
    import torch

    from hpcrl.core.config import load_config
    from hpcrl.envs import env_spaces
    cfg, _ = load_config(str(CONFIG))
    torch.set_num_threads(cfg.run.torch_threads)
    spaces = env_spaces(cfg.env)
    frames = ENV_RANKS * cfg.env.num_envs * cfg.algo.rollout_length
    fragments = real_fragments(cfg, spaces, ENV_RANKS)
    train, restore, sb3_shape = sb3_train(cfg, frames)
    cases = {"sb3_train": (train, restore), "hpcrl_plain": (hpcrl_update(cfg, spaces, fragments, False), None)}
    if horovod:
        from mpi4py import MPI

        from hpcrl.workers.averaging import start_horovod
        start_horovod(MPI.COMM_WORLD)
        cases["hpcrl_horovod"] = (hpcrl_update(cfg, spaces, fragments, True), None)
    times = {name: [] for name in cases}
    for round_ in range(repeats + 2):  # two warm-up rounds
        for name, (call, prepare) in cases.items():
            if prepare is not None:
                prepare()
            start = time.perf_counter()
            call()
            if round_ >= 2:
                times[name].append(time.perf_counter() - start)
    ms = {name: 1e3 * statistics.median(t) for name, t in times.items()}
    results = {name: {"ms_per_update": round(m, 2), "us_per_frame": round(1e3 * m / frames, 3),
                      "ms_per_update_quartiles": [round(1e3 * q, 2) for q in statistics.quantiles(times[name], n=4)]}
               for name, m in ms.items()}
    for name in cases:
        if name != "sb3_train":
            results[name]["ratio_to_sb3"] = round(ms[name] / ms["sb3_train"], 3)
    a = cfg.algo
    return {"benchmark": "PPO update at CartPole scale: hpcrl's trainer step against SB3 PPO.train()",
            "config": str(CONFIG.relative_to(REPO)), "frames_per_update": frames, "epochs": a.epochs,
            "minibatches": a.num_minibatches, "minibatch_rows": frames // a.num_minibatches,
            "hidden_sizes": list(cfg.model.hidden_sizes), "torch_threads": cfg.run.torch_threads,
            "repeats": repeats, "sb3": sb3_shape, "results": results}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=41)
    parser.add_argument("--out")
    parser.add_argument("--no-horovod", action="store_true", help="skip the Horovod case (and mpirun)")
    args = parser.parse_args()
    if not args.no_horovod and "OMPI_COMM_WORLD_SIZE" not in os.environ:  # Horovod's world of one learner
        cmd = ["bash", str(REPO / "scripts/mpirun.sh"), "-n", "1", sys.executable, str(Path(__file__).resolve()),
               *sys.argv[1:]]
        sys.exit(subprocess.run(cmd, cwd=REPO).returncode)
    emit(measure(args.repeats, horovod=not args.no_horovod), args.out)


if __name__ == "__main__":
    main()
