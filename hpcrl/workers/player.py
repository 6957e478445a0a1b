"""A run's policies playing whole episodes in one process, with no transport: `hpcrl eval`
(tools/evaluate.py) plays a checkpoint's weights, a learner root with run.eval its live ones
(workers/evaluator.py). The policies act through the policy holders' own code (a PolicySet of
runners that play, models/runner.py), so they act as they did in training."""
from __future__ import annotations

from typing import Callable

import gymnasium as gym
import numpy as np
import torch

from hpcrl.core.config import Config
from hpcrl.core.policies import policy_spaces, row_policies
from hpcrl.envs import GAME_OVER, RAW_REWARD
from hpcrl.envs.multiagent import ENV_DONE, episode_starts
from hpcrl.models import build_policy, make_runner
from hpcrl.workers.policy_holder import PolicySet, holder_states


def build_networks(cfg: Config, spaces) -> dict:
    """The run's networks as its learners build them, untrained: one per policy (an actor-critic,
    or a Q-network), the first one's weights being a checkpoint's 'model'."""
    if len(cfg.policies) <= 1:
        return {next(iter(cfg.policies), "model"): build_policy(spaces, cfg)}
    return {name: build_policy(own, cfg) for name, own in zip(cfg.policies, policy_spaces(spaces, cfg.policies))}


class Player:
    """A run's policies at the table, held as a policy holder holds them: its PolicySet acts for
    the env's rows (with several policies, each for the rows of its agents), and a recurrent
    policy keeps the rows' hidden state, zero at first and zeroed again where an episode ended."""

    def __init__(self, networks: dict, cfg: Config, spaces, play: str, generator: torch.Generator):
        """`play`: how its runners act (models/runner.py: "sample" or "greedy"); `generator`: what
        they draw from (every player of a game draws from one stream, in turn: a seed plays the
        same games)."""
        runners = [make_runner(net, "cpu", seed=0, play=play) for net in networks.values()]
        for runner in runners:
            runner.generator = generator
        self.policies = PolicySet(runners, [])  # no weights stream in: the networks' own stay
        self.row_policy = row_policies(cfg.policies, spaces.agents, 1) if len(networks) > 1 else None
        states = holder_states(self.policies, 1, spaces.num_agents)
        self.states = None if states is None else states[0]  # one env: one channel of rows
        self.actions = np.zeros((spaces.num_agents, *spaces.action_shape), dtype=spaces.action_dtype)

    def act(self, obs, mask: np.ndarray | None) -> np.ndarray:
        """The rows' actions (a new array): `obs` numpy (Dict observations: their leaves)."""
        self.policies.act(obs, {"actions": self.actions}, mask, self.row_policy, self.states)
        return self.actions.copy()

    def ended(self, starts: np.ndarray) -> None:
        if self.states is not None:
            self.states[starts.astype(bool)] = 0.0


def play_episodes(envs, obs, spaces, player: Player, episodes: int, rival=None, watch: Callable | None = None,
                  after_step: Callable[[], None] | None = None) -> tuple[list[float], list[int]]:
    """(returns, lengths) of `episodes` whole episodes of a vector of one env (`envs`, just reset
    to `obs`), one after another: taking the first N to finish of several parallel envs would
    favour short episodes. With SAME_STEP autoreset a finished env comes back reset at once.

    PettingZoo envs are one env of several agent rows: a return is the mean over the agents, or,
    against a `rival` (a player with `act(rows, mask)`), the return of the player's seat, which
    moves on by one every game. `watch(game, seat, rows, mask, actions, active)`, if given, sees
    every step before it is taken; `after_step()` runs after each (a video's frame, a heartbeat)."""
    returns: list[float] = []
    lengths: list[int] = []
    space = envs.single_action_space
    ret, length = 0.0, 0
    mask = getattr(envs.unwrapped, "action_mask", None)
    while len(returns) < episodes:
        rows = obs if spaces.obs_leaves is None else spaces.obs_leaves.flatten(obs)  # Dict observations' leaves
        actions = player.act(rows, mask)
        seat = len(returns) % spaces.num_agents
        if rival is not None:
            others = np.arange(len(actions)) != seat
            actions[others] = rival.act(rows, mask)[others]
        if isinstance(space, gym.spaces.Box):  # Gaussian policies: keep actions inside the bounds
            actions = np.clip(actions, space.low, space.high)
        if watch is not None:
            watch(len(returns), seat, rows, mask, actions, getattr(envs.unwrapped, "active", None))
        obs, reward, terminated, truncated, info = envs.step(actions)
        starts = episode_starts(terminated | truncated, info)  # as training saw them (an Atari life loss too)
        for one in (player, rival):
            if isinstance(one, Player):  # a recurrent policy zeroes the state of those rows
                one.ended(starts)
        mask = info.get("action_mask", mask)
        # as the metrics count them: raw rewards of whole games (Atari: all lives, unclipped)
        reward = info.get(RAW_REWARD, reward)
        ret, length = ret + float(reward[seat] if rival is not None else np.mean(reward)), length + 1
        if after_step is not None:
            after_step()
        if info.get(ENV_DONE, info.get(GAME_OVER, terminated | truncated))[0]:
            returns.append(ret)
            lengths.append(length)
            ret, length = 0.0, 0
    return returns, lengths
