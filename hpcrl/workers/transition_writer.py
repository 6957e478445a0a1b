"""Ape-X DQN's record writer (an env rank's; R2D2's is workers/sequence_writer.py): n-step
transitions of every env, with their initial priorities, for the trainers' replay shards.
Exploration and shipping are every DQN writer's (workers/replay_writer.py); numpy only.

Per reply for step t of a group (observations s_t, Q-values q_t):
1. every env whose window holds n steps emits the transition of step t-n, bootstrapped from s_t:
   G = r_t-n + g r_t-n+1 + ... + g^(n-1) r_t-1, discount g^n, priority |G + g^n max q_t - Q(s_t-n, a_t-n)|;
2. actions: greedy on q_t, or uniform with the env's epsilon;
3. the env steps; an env whose episode ended emits its whole window at once (discount 0 after
   a terminal step, g^k after a time limit, with s_t+k its final observation).
The initial priority of a transition cut by a time limit bootstraps from max q_t (the final
observation's value would take another round trip); the trainer writes back exact TD errors
once it samples it.
"""
from __future__ import annotations

import numpy as np

from hpcrl.algos.sequences import n_step_target
from hpcrl.core.messages import Message
from hpcrl.core.observations import apply, assign, fit, take
from hpcrl.workers.env_group import EnvGroup
from hpcrl.workers.replay_writer import RecordRows, ReplayWriter


class NStepWindow:
    """The last n steps of every env of one group, and the transitions they complete. All envs
    of a group step together, so step t of every env sits in ring slot t % n."""

    def __init__(self, n: int, gamma: float, num_envs: int, obs: np.ndarray, actions: np.ndarray,
                 value_rescale: bool = False):
        """`obs`, `actions`: one step's arrays, for their shapes and dtypes. `value_rescale`: the
        Q-values are h(Q) (algo.dqn.value_rescale), and so are the priorities' targets."""
        self.n, self.gamma, self.value_rescale = n, gamma, value_rescale
        self.obs = apply(lambda leaf: np.zeros((n, *leaf.shape), dtype=leaf.dtype), obs)  # Dict: per leaf
        self.actions = np.zeros((n, *actions.shape), dtype=actions.dtype)
        self.rewards = np.zeros((n, num_envs), dtype=np.float64)
        self.q = np.zeros((n, num_envs), dtype=np.float64)  # Q(s, a) of the action taken
        self.filled = np.zeros(num_envs, dtype=np.int64)  # steps held per env, at most n
        self.t = 0
        self.powers = gamma ** np.arange(n + 1)

    def emit_due(self, obs: np.ndarray, max_q: np.ndarray, out: RecordRows) -> None:
        """Before step t: emit the transitions now due, those of envs holding n steps (step t-n's,
        bootstrapped from s_t)."""
        envs = np.flatnonzero(self.filled == self.n)
        if not len(envs):
            return
        oldest = self.t % self.n
        returns = np.zeros(len(envs))
        for k in range(self.n):
            returns += self.powers[k] * self.rewards[(self.t + k) % self.n, envs]
        discount = self.powers[self.n]
        out.write(take(self.obs, (oldest, envs)), self.actions[oldest, envs], returns, np.full(len(envs), discount),
                  take(obs, envs), np.abs(n_step_target(returns, discount, max_q[envs], self.value_rescale)
                                    - self.q[oldest, envs]))
        self.filled[envs] -= 1

    def record(self, obs: np.ndarray, actions: np.ndarray, q_taken: np.ndarray) -> None:
        slot = self.t % self.n
        assign(self.obs, obs, slot)
        self.actions[slot], self.q[slot] = actions, q_taken

    def record_rewards(self, rewards: np.ndarray, terminated: np.ndarray, ended: np.ndarray, final_obs,
                       max_q: np.ndarray, out: RecordRows) -> None:
        """After step t: hold its rewards; envs whose episode `ended` emit every step they hold, into
        `final_obs[e]` (their last observation), with no bootstrap after a terminal step."""
        self.rewards[self.t % self.n] = rewards
        self.filled += 1
        for e in np.flatnonzero(ended):
            held = int(self.filled[e])
            slots = [(self.t - j) % self.n for j in range(held)]  # newest first
            returns = np.zeros(held)
            carry = 0.0
            for j, slot in enumerate(slots):
                carry = self.rewards[slot, e] + self.gamma * carry
                returns[j] = carry
            discounts = np.zeros(held) if terminated[e] else self.powers[1:held + 1]
            bootstrap = n_step_target(returns, discounts, max_q[e], self.value_rescale)
            final = fit(self.obs, final_obs[e])  # Dict: its leaves by key
            out.write(take(self.obs, (slots, e)), self.actions[slots, e], returns, discounts,
                      apply(lambda leaf: np.broadcast_to(leaf, (held, *np.shape(leaf))), final),
                      np.abs(bootstrap - self.q[slots, e]))
            self.filled[e] = 0
        self.t += 1


class TransitionWriter(ReplayWriter):
    """Ape-X's records: n-step transitions of every env of the rank, rollout_length x num_envs rows
    (a record ships once another group step might not fit)."""

    def attach(self, env_rank) -> None:
        super().attach(env_rank)
        # the most rows one group step writes: an env emits one due transition, then its whole
        # window of n steps if its episode ends there
        self.rows_per_step = self.per_group * (self.dqn.n_step + 1)
        actions = np.zeros(self.per_group, dtype=self.record["actions"].dtype)
        self.windows = [NStepWindow(self.dqn.n_step, self.cfg.algo.gamma, self.per_group, g.request["obs"], actions,
                                    self.dqn.value_rescale) for g in self.groups]

    def step(self, group: EnvGroup, reply: Message) -> None:
        window, q = self.windows[group.index], reply["q"]
        obs = group.request["obs"]
        max_q = q.max(1)
        window.emit_due(obs, max_q, self.out)
        actions = self.explore(group, q)
        window.record(obs, actions, q[np.arange(self.per_group), actions])
        self.stepping_window = window
        next_obs, rewards, terminated, truncated, info = group.envs.step(actions)
        ended = terminated | truncated
        window.record_rewards(rewards, terminated, ended, info.get("final_obs"), max_q, self.out)
        assign(group.request["obs"], fit(group.request["obs"], next_obs))
        self.tally.add(group, rewards, ended, info)
