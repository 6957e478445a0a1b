"""SAC's and TD3's record writer (an env rank's): n-step transitions of continuous actions, for the
trainers' replay shards. Shipping is every replay writer's (workers/replay_writer.py), the n-step
windows DQN's (workers/transition_writer.py); numpy only, so env ranks with remote inference stay
torch-free.

Per reply for step t of a group (the policy's actions in [-1, 1]):
1. every env whose window holds n steps emits the transition of step t-n, bootstrapped from s_t;
2. the actions: uniform in [-1, 1] until algo.sac.learning_starts frames of the run (all env
   ranks together, estimated from this rank's), else the policy's (SAC's are sampled already; TD3
   adds Gaussian noise of std exploration_noise per env, clipped to [-1, 1]);
3. the envs step with the actions rescaled to their bounds; the transitions keep them in [-1, 1],
   as the critics read them.
Initial priorities need the critics, so the rows carry -1: the learner's shard gives them its
largest priority, as prioritized replay does (with algo.replay.alpha 0, replay is uniform anyway).
"""
from __future__ import annotations

import numpy as np

from hpcrl.core.dataflow import algorithm_of
from hpcrl.core.messages import Message
from hpcrl.core.observations import assign, fit
from hpcrl.workers.env_group import EnvGroup
from hpcrl.workers.replay_writer import RecordRows, ReplayWriter
from hpcrl.workers.transition_writer import NStepWindow

UNKNOWN_PRIORITY = -1.0  # workers/replay_source.py: the shard's max priority


class UnknownPriorityRows(RecordRows):
    def write(self, obs, actions, returns, discounts, next_obs, priorities) -> None:
        super().write(obs, actions, returns, discounts, next_obs, np.full(len(returns), UNKNOWN_PRIORITY))


class ActionWriter(ReplayWriter):
    rows_class = UnknownPriorityRows

    def __init__(self, cfg, env_ranks: int = 1, frames: int = 0):
        super().__init__(cfg, env_ranks, frames)
        self.sac = cfg.algo.sac
        self.noise = self.sac.exploration_noise if algorithm_of(cfg).action_noise else 0.0

    def attach(self, env_rank) -> None:
        super().attach(env_rank)
        self.rows_per_step = self.per_group * (self.sac.n_step + 1)
        space = self.groups[0].envs.single_action_space  # the bounds the actions are rescaled to
        self.low, self.high = (np.asarray(b, dtype=np.float32) for b in (space.low, space.high))
        actions = np.zeros((self.per_group, *self.record["actions"].shape[1:]), dtype=np.float32)
        self.windows = [NStepWindow(self.sac.n_step, self.cfg.algo.gamma, self.per_group, g.request["obs"], actions)
                        for g in self.groups]
        self.no_values = np.zeros(self.per_group)  # no Q-values here: the priorities are the learner's

    def actions(self, reply: Message) -> np.ndarray:
        """The group's actions in [-1, 1]: random before learning_starts, else the policy's (with
        TD3's exploration noise)."""
        shape = reply["actions"].shape
        if self.frames * self.env_ranks < self.sac.learning_starts:
            return self.rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)
        actions = reply["actions"]
        if self.noise:
            actions = np.clip(actions + self.rng.normal(0.0, self.noise, size=shape), -1.0, 1.0)
        return actions.astype(np.float32)

    def step(self, group: EnvGroup, reply: Message) -> None:
        window = self.windows[group.index]
        obs = group.request["obs"]
        window.emit_due(obs, self.no_values, self.out)
        actions = self.actions(reply)
        window.record(obs, actions, self.no_values)
        self.stepping_window = window
        next_obs, rewards, terminated, truncated, info = group.envs.step(
            self.low + 0.5 * (actions + 1.0) * (self.high - self.low))
        ended = terminated | truncated
        window.record_rewards(rewards, terminated, ended, info.get("final_obs"), self.no_values, self.out)
        assign(group.request["obs"], fit(group.request["obs"], next_obs))
        self.tally.add(group, rewards, ended, info)
