"""DQN actors (env ranks): epsilon-greedy on their policy's Q-values, n-step transitions with their
initial priorities (or, with a recurrent Q-network, R2D2's sequences: workers/sequence_actor.py),
shipped in records to their trainer's replay shard.

Never imports torch: the Q-values arrive as numpy (from a policy server, or from the inline
policy the wiring hands in), and everything here is numpy. What it shares with the PPO actor
(env groups that step while others wait, the stop and goodbye sequence, episode statistics) is
inherited from `EnvRole`; what differs is what one reply turns into.

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

import time

import numpy as np

from hpcrl.core.config import Config
from hpcrl.core.observations import apply, assign, fit, take
from hpcrl.algos.exploration import apex_epsilons, linear_epsilon
from hpcrl.algos.sequences import n_step_target
from hpcrl.core.seeds import seed_for
from hpcrl.workers.actor import EnvGroup, EnvRole


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

    def ripe(self, obs: np.ndarray, max_q: np.ndarray, out: "TransitionWriter") -> None:
        """Before step t: envs with n steps held emit step t-n's transition, bootstrapped from s_t."""
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

    def rewarded(self, rewards: np.ndarray, terminated: np.ndarray, ended: np.ndarray, final_obs,
                 max_q: np.ndarray, out: "TransitionWriter") -> None:
        """After step t: its rewards; envs whose episode `ended` emit every step they hold, into
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


class TransitionWriter:
    """Appends rows (transitions, or R2D2's sequences) to the record being filled (a sample-stream buffer)."""

    def __init__(self, record):
        self.record, self.rows = record, 0
        self.capacity = record["priorities"].shape[0]

    def room(self) -> int:
        return self.capacity - self.rows

    def write(self, obs, actions, returns, discounts, next_obs, priorities) -> None:
        """One or more n-step transitions."""
        self.write_fields(obs=obs, actions=actions, returns=returns, discounts=discounts, next_obs=next_obs,
                          priorities=priorities)

    def write_fields(self, priorities: np.ndarray, **fields) -> None:
        """len(priorities) rows of the record's fields, by name."""
        a, b = self.rows, self.rows + len(priorities)
        self.record["priorities"][a:b] = priorities
        for name, values in fields.items():
            assign(self.record[name], values, slice(a, b))  # observations may be Dict leaves
        self.rows = b


class ReplayActor(EnvRole):
    """What DQN's actors share: epsilon-greedy exploration on the Q-values a reply brings, and
    records of rows for the trainers' replay shards, shipped once another group step might not
    fit. TransitionActor (below) writes n-step transitions; SequenceActor (workers/sequence_actor.py)
    R2D2's sequences, with a recurrent Q-network."""

    name = "env"
    record_name = "transitions"

    def __init__(self, cfg: Config, rank: int, index: int, policies: list, senders: list, env_ranks: int = 1,
                 start_version: int = 0, control=None):
        super().__init__(cfg, rank, index, policies, senders, start_version=start_version, control=control)
        d = self.dqn = cfg.algo.dqn
        self.per_group = self.N // len(self.groups)
        self.writer = TransitionWriter(self.fragment)
        self.rng = np.random.default_rng(seed_for(cfg.run.seed, "explore", index))
        self.env_ranks = env_ranks
        self.frames = 0  # env steps of this rank
        self.record_frames = 0  # env steps since the last record shipped
        self.record_version = -1  # the policy version of the record's first transition step
        # apex: this rank's envs are numbers index*N .. index*N+N-1 of every env rank's envs
        self.epsilons = apex_epsilons(d.eps, d.eps_alpha, env_ranks * self.N)[index * self.N:(index + 1) * self.N]

    @classmethod
    def actor_class(cls, cfg: Config) -> type:
        """The actor of the config's network: sequences for a recurrent one, else transitions."""
        if cfg.model.core != "none":
            from hpcrl.workers.sequence_actor import SequenceActor
            return SequenceActor
        return TransitionActor if cls is ReplayActor else cls

    @classmethod
    def build(cls, w) -> "ReplayActor":
        """From the wiring (hpcrl.runtime.wiring.Wiring), as the PPO actor: its policy (a policy
        server's channels, one per env group, or an inline policy) and its sender to the trainer."""
        index = w.layout.index_in("env", w.rank)
        cls = cls.actor_class(w.cfg)
        actor = cls(w.cfg, w.rank, index, cls.policies(w, index), cls.senders(w, index), env_ranks=len(w.layout.envs),
                    start_version=w.start.start_version, control=w.control)
        # a resume: this rank's share of the run's frames so far, where linear epsilon continues from
        actor.frames = w.start.start_frames // len(w.layout.envs)
        return actor

    def epsilon(self, g: int) -> np.ndarray:
        """The exploration of group g's envs now."""
        if self.dqn.eps_schedule == "apex":
            return self.epsilons[self.groups[g].columns]
        # linear: every env rank's frames, estimated from this rank's (the env ranks run alike)
        return np.full(self.per_group, linear_epsilon(self.dqn, self.frames * self.env_ranks))

    def explore(self, g: int, q: np.ndarray) -> np.ndarray:
        """Group g's actions on its Q-values `q` [envs, actions]: greedy, or uniform with each env's epsilon."""
        explore = self.rng.random(self.per_group) < self.epsilon(g)
        return np.where(explore, self.rng.integers(q.shape[1], size=self.per_group), q.argmax(1))

    def _take_reply(self, group: EnvGroup, reply) -> None:
        if self.record_version < 0:
            self.record_version = reply.get("version")
        self._step(group, reply)
        group.submit(self.version)  # at once: its round trip overlaps the other groups' steps
        self.frames += self.per_group
        self.record_frames += self.per_group

    def _ship(self) -> None:
        now = time.perf_counter()
        credit_wait = now - self.credit_wait_since if self.credit_wait_since is not None else 0.0
        self.credit_wait_since = None
        self.fragment.set(env_rank=self.rank, version=max(self.record_version, 0), index=self.fragments_sent,
                          frames=self.record_frames, flags=0, count=self.writer.rows,
                          rollout_us=int(1e6 * (now - self.rollout_start)), wait_us=int(1e6 * self.waited),
                          credit_wait_us=int(1e6 * credit_wait))
        self.fragment["episode_stats"][:] = self.episode_stats[0]
        self.fragment = self.sender.send()
        self.writer = TransitionWriter(self.fragment)
        self.fragments_sent += 1
        self.record_frames, self.record_version = 0, -1
        self.rollout_start, self.waited = time.perf_counter(), 0.0
        self._reset_stats()


class TransitionActor(ReplayActor):
    """Collects n-step transitions from its env groups and ships them in records of
    rollout_length x num_envs rows (a record ships once another group step might not fit)."""

    def __init__(self, cfg: Config, rank: int, index: int, policies: list, senders: list, env_ranks: int = 1,
                 start_version: int = 0, control=None):
        super().__init__(cfg, rank, index, policies, senders, env_ranks, start_version=start_version, control=control)
        # the most rows one group step writes: an env emits one ripe transition, then its whole
        # window of n steps if its episode ends there
        self.rows_per_step = self.per_group * (self.dqn.n_step + 1)
        actions = np.zeros(self.per_group, dtype=self.fragment["actions"].dtype)
        self.windows = [NStepWindow(self.dqn.n_step, cfg.algo.gamma, self.per_group, g.request["obs"], actions,
                                    self.dqn.value_rescale) for g in self.groups]

    def _record_full(self) -> bool:
        """No group may step on until the record ships: another step might not fit."""
        return self.writer.room() < self.rows_per_step

    def _step(self, group: EnvGroup, reply) -> None:
        g = self.groups.index(group)
        window, q = self.windows[g], reply["q"]
        obs = group.request["obs"]
        max_q = q.max(1)
        window.ripe(obs, max_q, self.writer)
        actions = self.explore(g, q)
        window.record(obs, actions, q[np.arange(self.per_group), actions])
        self.status = f"stepping envs (step {window.t})"
        next_obs, rewards, terminated, truncated, info = group.envs.step(actions)
        ended = terminated | truncated
        window.rewarded(rewards, terminated, ended, info.get("final_obs"), max_q, self.writer)
        assign(group.request["obs"], fit(group.request["obs"], next_obs))
        self._tally(group, rewards, ended, info)
