"""R2D2's record writer (an env rank's; DQN with model.core): fixed-length sequences of every env
with the recurrent state they start from, and their initial priorities (Kapturowski et al. 2019),
for the trainers' replay shards. Exploration and shipping are every DQN writer's
(workers/replay_writer.py).

Never imports torch: the policy holder (a policy server, or the inline policy) keeps every env's
hidden state, zeroes it where an episode begins (the request's `starts`), and sends back with
each step's Q-values the state they were computed from. The actor keeps the last L steps of each
env (L = algo.dqn.sequence_length) and every sequence_period steps emits them as one sequence per
env, starting from the stored state of its first step: consecutive sequences overlap by
L - sequence_period steps, and may hold episode ends (the trainer zeroes the state where the next
episode begins). A time limit's final observation rides on the next request, as with PPO, and its
value (from the state the episode ended in) comes back with the next reply.
"""
from __future__ import annotations

import numpy as np

from hpcrl.algos.sequences import sequence_priorities, sequence_targets
from hpcrl.core.config import Config
from hpcrl.core.messages import Message
from hpcrl.core.observations import apply, assign, fit, leaves
from hpcrl.workers.env_group import EnvGroup
from hpcrl.workers.replay_writer import RecordRows, ReplayWriter


class SequenceWindow:
    """The last L steps of every env of one group (all step together): observations 0..L, actions,
    rewards, episode ends, final-observation values, the behaviour Q-values (for the initial
    priorities) and the recurrent state before each step. `i` is the next step's index in the
    window; when it reaches L the window is full, emits its sequences and slides on by the period."""

    def __init__(self, cfg: Config, envs: int, obs, action_dtype, state_size: int):
        """`obs`: one step's observations (a request's), for their shapes and dtypes."""
        d = cfg.algo.dqn
        self.L, self.burn_in, self.period, self.eta = d.sequence_length, d.burn_in, d.sequence_period, d.priority_eta
        self.gamma, self.n, self.value_rescale = cfg.algo.gamma, d.n_step, d.value_rescale
        L = self.L
        self.obs = apply(lambda leaf: np.zeros((L + 1, *leaf.shape), dtype=leaf.dtype), obs)
        self.actions = np.zeros((L, envs), dtype=action_dtype)
        self.rewards = np.zeros((L, envs), dtype=np.float32)
        self.terminated = np.zeros((L, envs), dtype=np.uint8)
        self.truncated = np.zeros((L, envs), dtype=np.uint8)
        self.final_values = np.zeros((L, envs), dtype=np.float32)
        self.q_taken = np.zeros((L, envs), dtype=np.float32)
        self.max_q = np.zeros((L + 1, envs), dtype=np.float32)
        self.states = np.zeros((L + 1, envs, state_size), dtype=np.float32)
        # every array of the window, step-major: what slides on after each emission
        self.steps = (*leaves(self.obs), self.actions, self.rewards, self.terminated, self.truncated, self.final_values,
                      self.q_taken, self.max_q, self.states)
        self.i = 0
        self.emitted = 0  # sequences per env so far

    def finals(self, rows: np.ndarray, values: np.ndarray) -> None:
        """The values of the final observations of episodes the last step truncated, in `rows`."""
        self.final_values[self.i - 1, rows] = values

    def observe(self, obs, q: np.ndarray, state: np.ndarray) -> bool:
        """Step i's observations, Q-values and the states they came from; True when the window is full."""
        i = self.i
        assign(self.obs, obs, i)
        self.max_q[i] = q.max(1)
        self.states[i] = state
        return i == self.L

    def acted(self, actions: np.ndarray, q_taken: np.ndarray) -> None:
        self.actions[self.i], self.q_taken[self.i] = actions, q_taken

    def stepped(self, rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> None:
        i = self.i
        self.rewards[i], self.terminated[i], self.truncated[i] = rewards, terminated, truncated
        self.final_values[i] = 0.0  # set by `finals` for the truncated rows, one reply later
        self.i += 1

    def priorities(self) -> np.ndarray:
        """Each env's sequence's initial priority: its trained steps' |TD errors| against the
        behaviour Q-values (max_a Q bootstraps), mixed by eta."""
        b = self.burn_in
        targets = sequence_targets(self.rewards, self.terminated, self.truncated, self.final_values, self.max_q[b:],
                                   self.gamma, self.n, b, self.value_rescale)
        return sequence_priorities(np.abs(targets - self.q_taken[b:]), self.eta)

    def emit(self, out: RecordRows) -> None:
        """One sequence per env into the record (rows [envs, L(+1), ...]), then slide by the period."""
        a = out.rows
        envs = self.actions.shape[1]
        assign(out.record["obs"], apply(lambda x: np.swapaxes(x, 0, 1), self.obs), slice(a, a + envs))
        out.write_fields(self.priorities(), actions=self.actions.swapaxes(0, 1),
                            rewards=self.rewards.T, terminated=self.terminated.T, truncated=self.truncated.T,
                            final_values=self.final_values.T, state0=self.states[0])
        self.emitted += 1
        p = self.period
        for steps in self.steps:
            steps[:len(steps) - p] = steps[p:]  # numpy copies overlapping ranges through a buffer
        self.i = self.L - p


class SequenceWriter(ReplayWriter):
    """R2D2's records: a record carries the sequences that start in rollout_length steps of every
    env (core/dataflow.py's replay_record), and ships once another group's emission might not fit."""

    record_name = "sequences"

    def attach(self, env_rank) -> None:
        super().attach(env_rank)
        self.rows_per_step = self.per_group  # a group's step emits at most one sequence per env
        state_size = self.record["state0"].shape[1]
        self.windows = [SequenceWindow(self.cfg, self.per_group, g.request["obs"], self.record["actions"].dtype,
                                       state_size) for g in self.groups]

    def stepping(self) -> str:
        window = self.stepping_window
        return "stepping envs" if window is None else f"stepping envs (sequence {window.emitted}, step {window.i})"

    def serial_parts(self) -> dict | None:
        return None  # its windows hold the recurrent states of sequences in flight: not saved yet

    def step(self, group: EnvGroup, reply: Message) -> None:
        window, q = self.windows[group.index], reply["q"]
        if len(group.final_rows):  # the last step truncated episodes: their final observations' values
            window.finals(*group.truncation_values(reply))
        if window.observe(group.request["obs"], q, reply["state"]):
            window.emit(self.out)
        actions = self.explore(group, q)
        window.acted(actions, q[np.arange(self.per_group), actions])
        self.stepping_window = window
        next_obs, rewards, terminated, truncated, info = group.envs.step(actions)
        window.stepped(rewards, terminated, truncated)
        obs = fit(group.request["obs"], next_obs)
        assign(group.request["obs"], obs)
        group.carry_final_obs(truncated & ~terminated, obs, info)  # their values: from the ended episodes' states
        done = terminated | truncated
        self.tally.add(group, rewards, done, info)
        group.request["starts"][...] = done
