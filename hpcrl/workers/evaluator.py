"""Evaluation during training (run.eval, as SB3's EvalCallback): each time the run's frames pass a
multiple of run.eval.every_frames, the learner root plays run.eval.episodes whole episodes with
its current weights on an env of its own, and its metrics row carries their mean return, its
spread and the mean length (the eval_* series of metrics.h5, `eval/` in TensorBoard; NaN in the
rows of other updates). Training waits meanwhile, on every trainer: the evaluation belongs to the
update it follows, so a run repeats with it as without it.

Each evaluation's env takes a seed of its own, keyed by the multiple passed, and the players draw
from a generator keyed the same way: an evaluation repeats whatever ran before it, and a resumed
run evaluates as the uninterrupted one did. The weights are copied into networks on the CPU, so
the learner's own (on a GPU, perhaps) and its random streams are left as they are."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from hpcrl.core.config import Config
from hpcrl.core.seeds import seed_for
from hpcrl.envs import make_vector_env
from hpcrl.workers.player import Player, build_networks, play_episodes

SERIES = ("eval_return_mean", "eval_return_std", "eval_length_mean")
NO_EVALUATION = {key: math.nan for key in SERIES}


class Evaluator:
    def __init__(self, cfg: Config, spaces, frames: int, heartbeat=lambda: None):
        """`spaces`: the env's (hpcrl.envs.EnvSpaces); `frames`: the run's frames at its start (a
        resume does not evaluate again at a multiple its checkpoint passed); `heartbeat`: called
        every step, so a long evaluation is work, not a hang."""
        self.cfg, self.spaces, self.heartbeat = cfg, spaces, heartbeat
        self.every = cfg.run.eval.every_frames
        self.passed = frames // self.every
        with torch.random.fork_rng(devices=[]):  # their initial weights are drawn from a stream training leaves alone
            self.networks = build_networks(cfg, spaces)
        self.env_cfg = dataclasses.replace(cfg.env, num_envs=1, groups=1)

    def after_update(self, frames: int, model: torch.nn.Module) -> dict[str, float]:
        """The eval_* values of this update's row: an evaluation's where `frames` passed another
        multiple of run.eval.every_frames, NaN otherwise."""
        passed = frames // self.every
        if passed <= self.passed:
            return dict(NO_EVALUATION)
        self.passed = passed
        returns, lengths = self.play(model, passed)
        return {"eval_return_mean": float(np.mean(returns)), "eval_return_std": float(np.std(returns)),
                "eval_length_mean": float(np.mean(lengths))}

    def play(self, model: torch.nn.Module, index: int) -> tuple[list[float], list[int]]:
        """(returns, lengths) of run.eval.episodes episodes with `model`'s weights; `index`: which
        evaluation of the run this is (its seeds)."""
        network = next(iter(self.networks.values()))
        network.load_state_dict(model.state_dict())  # (a copy, across devices too)
        e = self.cfg.run.eval
        generator = torch.Generator().manual_seed(seed_for(self.cfg.run.seed, "eval", index, group=1))
        player = Player(self.networks, self.cfg, self.spaces, "greedy" if e.deterministic else "sample", generator)
        envs, obs = make_vector_env(self.env_cfg, seed=seed_for(self.cfg.run.seed, "eval", index),
                                    gamma=self.cfg.algo.gamma)
        try:
            with torch.no_grad():
                return play_episodes(envs, obs, self.spaces, player, e.episodes, after_step=self.heartbeat)
        finally:
            envs.close()
