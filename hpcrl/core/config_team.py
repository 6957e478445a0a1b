"""The config section of the value-decomposition algorithms, VDN and QMIX (algo.team).

Their replay (algo.replay) holds episodes of a whole team, each stored whole up to
episode_length steps: its capacity, warm-up and batch count episodes. The defaults are PyMARL's
and EPyMARL's (Rashid et al. 2018; Papoudakis et al. 2021): batches of 32 episodes, a target
network copied every 200 gradient steps, epsilon from 1 to 0.05 over 50,000 env steps, rewards
standardised, agents sharing one network that also reads their one-hot index, QMIX's mixing
embedding of 32 from hypernetworks of one hidden layer of 64.
"""
from __future__ import annotations

from dataclasses import dataclass

from hpcrl.core.config_base import AT_LEAST_ONE, OneOf, Range, check, check_ranges, doc
from hpcrl.core.config_dqn import EPS_SCHEDULES, EpsilonGreedy, ReplayConfig, validate_replay

TEAM_WARMUP, TEAM_ALPHA = 32, 0.0  # algo.replay's defaults for vdn and qmix: one batch, uniform (PyMARL's)
TEAM_REWARDS = ("sum", "mean")


@dataclass
class TeamConfig(EpsilonGreedy):
    """Agents' Q-values mixed into the team's: VDN sums them, QMIX mixes them monotonically by the
    env's state. Exploration is epsilon-greedy per agent row (the keys it shares with algo.dqn)."""

    eps_schedule: str = doc("exploration: 'linear' (one epsilon, from eps_start to eps_final over "
                            "eps_decay_frames; PyMARL's) or 'apex' (a fixed epsilon per agent row, eps_i = eps ^ (1 + "
                            "eps_alpha * i / (N - 1)) over the N rows of every env rank, Horgan et al. 2018)",
                            default="linear")
    eps_decay_frames: int = doc("linear: frames (env steps, all env ranks together) over which epsilon falls",
                                range=AT_LEAST_ONE, default=50_000)
    episode_length: int = doc("steps of an episode stored whole (its chunk); an episode that runs longer is stored "
                              "in chunks of this many steps, each starting from its stored recurrent state. Set it "
                              "to the env's episode limit (MPE: 25, Level-Based Foraging: 50)",
                              range=Range(1, 100_000, words="1 to 100,000 steps"), default=50)
    batch_size: int = doc("episodes per gradient step, all learners together (each samples batch_size / learners "
                          "from its own replay shard; Horovod averages the gradients)", range=AT_LEAST_ONE,
                          default=32)
    gradient_steps: int = doc("gradient steps per update, each on its own sample; the weights are published and a "
                              "metrics row written once per update (algo.mode sync: not used; each round trains "
                              "the steps algo.replay.replay_ratio owes)", range=AT_LEAST_ONE, default=1)
    target_update_interval: int = doc("gradient steps between copies of the online networks (agents and mixer) "
                                      "into the target networks", range=Range(1, words=">= 1 gradient steps"),
                                      default=200)
    double: bool = doc("double Q-learning: each agent's online network picks its next action, the target networks "
                       "value the team's choice", default=True)
    shared: bool = doc("one Q-network for every agent (parameter sharing); false: one per agent", default=True)
    agent_id: bool = doc("the shared network also reads the agent's index, one-hot (with shared: false each agent "
                         "has its own network, so this changes nothing)", default=True)
    reward: str = doc("the team's reward from its agents' rewards at each step: their 'sum' (EPyMARL's) or 'mean'",
                      range=OneOf(TEAM_REWARDS), default="sum")
    time_limit_bootstraps: bool = doc("an episode cut off by its env's time limit (truncated) bootstraps from the "
                                      "team's value of its final observation; false: it ends there as a "
                                      "termination does, as in EPyMARL's benchmark, whose wrapper of MPE and "
                                      "Level-Based Foraging ended episodes at the limit (the values then stay within "
                                      "an episode's horizon)", default=False)
    standardize_rewards: bool = doc("train on the team's rewards standardised by the running mean and standard "
                                    "deviation of every sampled batch's (all learners together), as EPyMARL's "
                                    "standardise_rewards: a sparse reward of any scale then weighs as a dense one",
                                    default=True)
    mixing_embed: int = doc("qmix: the mixing network's hidden width", range=AT_LEAST_ONE, default=32)
    hypernet_hidden: int = doc("qmix: the hidden width of the hypernetworks that make the mixing weights from "
                               "the state", range=AT_LEAST_ONE, default=64)


def resolve_team_replay(replay: ReplayConfig) -> None:
    """algo.replay's null warm-up and alpha for vdn and qmix: one batch of episodes, uniform replay."""
    replay.warmup = TEAM_WARMUP if replay.warmup is None else replay.warmup
    replay.alpha = TEAM_ALPHA if replay.alpha is None else replay.alpha


def validate_team(t: TeamConfig, r: ReplayConfig) -> None:
    check_ranges(t, "algo.team")
    check(t.eps_schedule in EPS_SCHEDULES,
          f"algo.team.eps_schedule: expected one of {', '.join(EPS_SCHEDULES)}, got {t.eps_schedule!r}")
    validate_replay(r, t.batch_size, "algo.team")
