"""The config section of SAC and TD3 (algo.sac): continuous control off the replay workers.

Both run on the same dataflow as Ape-X DQN (core/dataflow.py): the env ranks write n-step
transitions (workers/action_writer.py), each learner keeps a replay shard (algo.replay), and the
learners average every gradient step with Horovod. Sizes are for all learners together, as DQN's.

`replay_settings` is the one place that says which section holds a replay algorithm's n-step,
batch and gradient-step counts, so the sizing, the writers and the batch source read them alike.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from hpcrl.core.config_base import AT_LEAST_ONE, NON_NEGATIVE, Range, check, check_ranges, doc
from hpcrl.core.config_dqn import validate_replay
from hpcrl.core.dataflow import ALGORITHMS


@dataclass
class SACConfig:
    """SAC (Haarnoja et al. 2018) and TD3 (Fujimoto et al. 2018) on n-step transitions from the actors."""

    n_step: int = doc("steps in each return, computed by the actors (1: the papers' one-step targets)",
                      range=AT_LEAST_ONE, default=1)
    batch_size: int = doc("transitions per gradient step, all learners together (each samples batch_size / "
                          "learners from its own replay shard; Horovod averages the gradients)",
                          range=AT_LEAST_ONE, default=256)
    gradient_steps: int = doc("gradient steps per update, each on its own sample; the weights are published and "
                              "a metrics row written once per update (algo.mode sync: not used; each round trains "
                              "the steps algo.replay.replay_ratio owes)", range=AT_LEAST_ONE, default=1)
    learning_starts: int = doc("frames (all env ranks together) of uniformly random actions before the policy "
                               "acts; the learners wait for algo.replay.warmup transitions besides", default=10_000)
    tau: float = doc("Polyak step of the target networks after every gradient step: target <- (1 - tau) target "
                     "+ tau online", range=Range(0, 1, above=True, words="a Polyak step in (0, 1]"), default=0.005)
    alpha: Union[float, None] = doc("SAC: the entropy coefficient; null: tuned automatically towards "
                                    "target_entropy (Haarnoja et al. 2018b)",
                                    range=Range(0, words="a coefficient >= 0 or null (tuned)"), default=None)
    alpha_init: float = doc("SAC, alpha null: the entropy coefficient at the start",
                            range=Range(0, above=True, words="> 0"), default=1.0)
    target_entropy: Union[float, None] = doc("SAC, alpha null: the entropy the tuning aims at; null: -|A| "
                                             "(minus the action dimension)", default=None)
    policy_delay: int = doc("gradient steps per actor (and target) update: TD3's delayed policy updates (2); "
                            "SAC: 1", range=Range(1, words=">= 1 gradient steps"), default=1)
    target_noise: float = doc("TD3: std of the Gaussian noise on the target policy's actions (target policy "
                              "smoothing), in units of the action range's half-width",
                              range=NON_NEGATIVE, default=0.2)
    target_noise_clip: float = doc("TD3: that noise is clipped to +-this", range=NON_NEGATIVE, default=0.5)
    exploration_noise: float = doc("TD3: std of the Gaussian noise the env ranks add to the policy's actions, "
                                   "per env, in units of the action range's half-width",
                                   range=NON_NEGATIVE, default=0.1)


def replay_settings(algo) -> tuple[object, str]:
    """The section that holds a replay algorithm's n_step, batch_size and gradient_steps, and its
    key prefix for messages: (algo.dqn, 'algo.dqn') or (algo.sac, 'algo.sac')."""
    # (algo.dqn for the others: callers such as hpcrl tune's report take it for any algorithm and
    # use it only for replay algorithms)
    section = ALGORITHMS[algo.name].replay_section or "dqn"
    return getattr(algo, section), f"algo.{section}"


def resolve_sac_replay(s: SACConfig, replay) -> None:
    """algo.replay's null warmup and alpha for SAC and TD3: learning_starts (at least batch_size, at
    most the capacity) and 0 (uniform replay)."""
    if replay.warmup is None:
        replay.warmup = min(max(s.learning_starts, s.batch_size), replay.capacity)
    if replay.alpha is None:
        replay.alpha = 0.0


def validate_sac(s: SACConfig, replay) -> None:
    """`replay`: algo.replay, whose capacity the start must fit (resolved: resolve_sac_replay)."""
    check_ranges(s, "algo.sac")
    check(0 <= s.learning_starts <= replay.capacity,
          f"algo.sac.learning_starts: {s.learning_starts:,} random frames would not fit algo.replay.capacity "
          f"({replay.capacity:,} transitions): expected 0 to {replay.capacity:,}")
    validate_replay(replay, s.batch_size, "algo.sac")
