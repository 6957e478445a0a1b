"""The config sections of DQN (algo.dqn) and of its prioritized replay (algo.replay).

Sizes are for all learners together (each learner owns one replay shard and samples its share),
so a layout with more learners runs the same algorithm: the same batch per gradient step, the
same replay capacity and warm-up, the same replay ratio.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from hpcrl.core.config_base import AT_LEAST_ONE, FRACTION, NON_NEGATIVE, Range, check, check_ranges, doc

EPS_SCHEDULES = ("apex", "linear")


@dataclass
class EpsilonGreedy:
    """Epsilon-greedy exploration on the actors' Q-values (workers/replay_writer.py): DQN's and
    the value-decomposition algorithms' (algo.team)."""

    eps_schedule: str = doc("exploration: 'apex' (a fixed epsilon per env, eps_i = eps ^ (1 + eps_alpha * i / "
                            "(N - 1)) over the N env rows of every env rank, Horgan et al. 2018) or 'linear' (one "
                            "epsilon, from eps_start to eps_final over eps_decay_frames; for small runs)",
                            default="apex")
    eps: float = doc("apex: the largest epsilon (env 0's)", range=FRACTION, default=0.4)
    eps_alpha: float = doc("apex: how fast epsilon falls over the envs", range=NON_NEGATIVE, default=7.0)
    eps_start: float = doc("linear: epsilon at the start", range=FRACTION, default=1.0)
    eps_final: float = doc("linear: epsilon after eps_decay_frames", range=FRACTION, default=0.05)
    eps_decay_frames: int = doc("linear: frames (all env ranks together) over which epsilon falls",
                                range=AT_LEAST_ONE, default=10_000)


@dataclass
class DQNConfig(EpsilonGreedy):
    """Double DQN with a dueling head, n-step returns computed on the actors, Ape-X exploration."""

    n_step: int = doc("steps in each return: r_t + g r_t+1 + ... + g^(n-1) r_t+n-1, bootstrapped from step "
                      "t+n (computed by the actors for transitions, by the learner inside R2D2's sequences)",
                      range=AT_LEAST_ONE, default=3)
    batch_size: int = doc("transitions (sequences, with model.core) per gradient step, all learners together "
                          "(each samples batch_size / learners from its own replay shard; Horovod averages the "
                          "gradients)", range=AT_LEAST_ONE, default=64)
    double: bool = doc("double DQN: the online network picks the next action, the target network values it",
                       default=True)
    dueling: bool = doc("dueling head: Q = V + A - mean(A) (Wang et al. 2016)", default=True)
    gradient_steps: int = doc("gradient steps per update, each on its own sample (priorities are written back "
                              "after each); the weights are published and a metrics row written once per update "
                              "(algo.mode sync: not used; each round trains the steps algo.replay.replay_ratio owes)",
                              range=AT_LEAST_ONE, default=16)
    target_update_interval: int = doc("gradient steps between copies of the online network into the target "
                                      "network", range=Range(1, words=">= 1 gradient steps"), default=500)
    value_rescale: bool = doc("learn h(Q) with R2D2's h(x) = sign(x)(sqrt(|x| + 1) - 1) + 0.001 x (Pohlen et al. "
                              "2018): targets h(G + g^k h^-1(Q')), for returns of very different sizes (R2D2 uses it)",
                              default=False)
    # R2D2 (model.core: lstm or gru; Kapturowski et al. 2019): the replay holds sequences
    sequence_length: int = doc("model.core: steps per stored sequence, burn-in included (R2D2: 80)", default=80)
    burn_in: int = doc("model.core: the first steps of each sequence only warm the recurrent state up from "
                       "the stored one; the loss covers the rest (R2D2: 40)", default=40)
    sequence_period: int = doc("model.core: steps between the starts of an env's consecutive sequences; at most "
                               "sequence_length - burn_in, so every step is trained (R2D2: 40, sequences "
                               "overlap by half)", default=40)
    priority_eta: float = doc("model.core: a sequence's priority is eta max |TD| + (1 - eta) mean |TD| over its "
                              "trained steps (R2D2: 0.9)", range=FRACTION, default=0.9)


@dataclass
class ReplayConfig:
    """Proportional prioritized replay (Schaul et al. 2016), one shard per learner."""

    capacity: int = doc("transitions (sequences, with model.core) held, all shards together (the oldest are "
                        "overwritten)", default=1_000_000)
    warmup: Union[int, None] = doc("transitions (sequences, with model.core) held, all shards together, before "
                                   "the learners start training (null: 50,000 for dqn; for sac and td3 "
                                   "algo.sac.learning_starts, at least algo.sac.batch_size)", default=None)
    alpha: Union[float, None] = doc("priority exponent: P(i) ~ p_i ^ alpha (0: uniform replay; null: 0.6 for dqn, "
                                    "0 for sac and td3)", range=NON_NEGATIVE, default=None)
    beta: float = doc("importance-sampling exponent at the start, annealed linearly to 1 at run.total_frames",
                      range=FRACTION, default=0.4)
    replay_ratio: Union[float, None] = doc(
        "transitions (sequences, with model.core) sampled per one inserted; the learners hold back their actors' "
        "records (credit flow control) while they are behind it. null: learners train as fast as they can and actors never wait "
        "for them (Ape-X)", range=Range(0, above=True, words="a number > 0 or null"), default=None)
    checkpoint: bool = doc("save every learner's replay shard (replay-K.h5 in the run directory) with each checkpoint, "
                           "so a resume with the same learner count trains on at once; it can be gigabytes. Without "
                           "it a resumed run fills its replay again (warmup transitions) before it trains. With it a "
                           "serial DQN, SAC or TD3 resume is exact ([algorithms]"
                           "(algorithms.md#an-exact-serial-resume-of-a-replay-run))",
                           default=False)


DQN_WARMUP, DQN_ALPHA = 50_000, 0.6  # algo.replay's defaults for dqn


def validate_dqn(d: DQNConfig, r: ReplayConfig, recurrent: bool = False) -> None:
    """`recurrent`: model.core is set (R2D2's sequences; capacity, warm-up and batch count sequences)."""
    if recurrent:
        check(d.sequence_length >= 2, f"algo.dqn.sequence_length: expected >= 2 steps, got {d.sequence_length}")
        check(0 <= d.burn_in < d.sequence_length,
              f"algo.dqn.burn_in: expected 0 to sequence_length - 1 ({d.sequence_length - 1}) steps, got {d.burn_in}")
        trained = d.sequence_length - d.burn_in
        check(1 <= d.sequence_period <= trained,
              f"algo.dqn.sequence_period: expected 1 to sequence_length - burn_in ({trained}) steps, so that every "
              f"step is trained in some sequence, got {d.sequence_period}")
    check_ranges(d, "algo.dqn")
    check(d.eps_schedule in EPS_SCHEDULES,
          f"algo.dqn.eps_schedule: expected one of {', '.join(EPS_SCHEDULES)}, got {d.eps_schedule!r}")
    validate_replay(r, d.batch_size, "algo.dqn")


def validate_replay(r: ReplayConfig, batch_size: int, section: str) -> None:
    """algo.replay against the batch of the algorithm's `section` (algo.dqn or algo.sac), once
    its null warm-up and alpha are resolved."""
    check(r.capacity >= batch_size, f"algo.replay.capacity: expected at least {section}.batch_size "
                                    f"({batch_size}) transitions, got {r.capacity}")
    check(batch_size <= r.warmup <= r.capacity,
          f"algo.replay.warmup: expected between {section}.batch_size ({batch_size}) and algo.replay.capacity "
          f"({r.capacity}) transitions, got {r.warmup}")
    check_ranges(r, "algo.replay")
