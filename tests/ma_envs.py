"""A small PettingZoo parallel env for tests ('tests.ma_envs:Relay'): agents that leave early,
shared and individual rewards, and a report of the heavy modules each process imported."""
import os
import sys

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class Relay(ParallelEnv):
    """`num_agents` agents for `length` steps. Agent i is rewarded 1 when its action equals i % 2.
    Agent `leaver` terminates after `leave_at` steps and the others play on; the episode then ends
    by truncation at `length`. Observations: [step, agent index, 1]."""

    metadata = {"name": "relay_v0", "is_parallelizable": True}

    def __init__(self, num_agents: int = 3, length: int = 6, leaver: int = 2, leave_at: int = 2,
                 report_dir: str | None = None, wide_agent: int | None = None, rich_agent: int | None = None,
                 box_agent: int | None = None, terminal_end: bool = False):
        """`wide_agent`: that agent observes 4 numbers instead of 3; `rich_agent`: that agent has 3
        actions instead of 2 (and is rewarded for action 2); `box_agent`: continuous actions for that
        agent (agents whose spaces differ); `terminal_end`: the episode terminates at `length` instead
        of being truncated (its values are then the discounted rewards still to come)."""
        self.terminal_end = terminal_end
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.length, self.leaver, self.leave_at, self.report_dir = length, leaver, leave_at, report_dir
        self.wide_agent, self.rich_agent, self.box_agent = wide_agent, rich_agent, box_agent
        self.t = 0
        self.agents = []

    def observation_space(self, agent):
        wide = self.wide_agent is not None and agent == f"agent_{self.wide_agent}"
        return spaces.Box(0.0, 100.0, (4 if wide else 3,), np.float32)

    def action_space(self, agent):
        if self.box_agent is not None and agent == f"agent_{self.box_agent}":
            return spaces.Box(-1.0, 1.0, (1,), np.float32)
        return spaces.Discrete(3 if self.rich_agent is not None and agent == f"agent_{self.rich_agent}" else 2)

    def _obs(self, agent):
        extra = [7.0] if self.wide_agent is not None and agent == f"agent_{self.wide_agent}" else []
        return np.array([self.t, self.possible_agents.index(agent), 1.0, *extra], np.float32)

    def _goal(self, agent) -> int:
        index = self.possible_agents.index(agent)
        return 2 if self.rich_agent == index else index % 2

    def reset(self, seed=None, options=None):
        self.t = 0
        self.agents = list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        for agent, action in actions.items():
            if not self.action_space(agent).contains(np.asarray(action, dtype=self.action_space(agent).dtype)):
                raise ValueError(f"{agent} took action {action}, outside its space {self.action_space(agent)}")
        rewards = {a: float(actions[a] == self._goal(a)) for a in actions}
        leaving = f"agent_{self.leaver}"
        end = self.t >= self.length
        terminated = {a: (a == leaving and self.t >= self.leave_at) or (end and self.terminal_end) for a in actions}
        truncated = {a: end and not self.terminal_end for a in actions}
        observations = {a: self._obs(a) for a in actions}
        self.agents = [a for a in self.agents if not (terminated[a] or truncated[a])]
        return observations, rewards, terminated, truncated, {a: {} for a in actions}

    def close(self):
        if self.report_dir is not None:
            rank = os.environ.get("OMPI_COMM_WORLD_RANK", "serial")
            loaded = sorted(m for m in ("torch", "horovod") if m in sys.modules)
            with open(os.path.join(self.report_dir, f"rank{rank}-{os.getpid()}.txt"), "w") as fh:
                fh.write(",".join(loaded))


class MaskedRelay(Relay):
    """Relay whose agents observe PettingZoo's {"observation", "action_mask"} dict (or, with
    `mask_in_info`, get the mask in their infos). Each step a random one of the 3 actions is
    invalid; taking it raises, so a run that finishes never let one through."""

    def __init__(self, mask_in_info: bool = False, **kwargs):
        super().__init__(**kwargs)
        self.mask_in_info = mask_in_info
        self.rng = np.random.default_rng(0)
        self.masks = {}

    def observation_space(self, agent):
        box = super().observation_space(agent)
        if self.mask_in_info:
            return box
        return spaces.Dict({"observation": box, "action_mask": spaces.Box(0, 1, (3,), np.int8)})

    def action_space(self, agent):
        return spaces.Discrete(3)

    def _obs(self, agent):
        mask = np.ones(3, np.int8)
        mask[self.rng.integers(3)] = 0
        self.masks[agent] = mask
        box = super()._obs(agent)
        return box if self.mask_in_info else {"observation": box, "action_mask": mask}

    def _infos(self, agents):
        return {a: ({"action_mask": self.masks[a]} if self.mask_in_info else {}) for a in agents}

    def reset(self, seed=None, options=None):
        observations, _ = super().reset(seed=seed, options=options)
        return observations, self._infos(observations)

    def step(self, actions):
        for agent, action in actions.items():
            if not self.masks[agent][action]:
                raise ValueError(f"{agent} took action {action}, invalid under its mask {self.masks[agent]}")
        observations, rewards, terminated, truncated, _ = super().step(actions)
        return observations, rewards, terminated, truncated, self._infos(observations)


class StatefulRelay(Relay):
    """Relay with a global state (PettingZoo's state() and state_space): the step and how many
    agents are still in the episode, which no single agent observes."""

    state_space = spaces.Box(0.0, 100.0, (2,), np.float32)

    def state(self):
        return np.array([self.t, len(self.agents)], np.float32)


class DictRelay(Relay):
    """Relay whose agents observe a nested dict beside PettingZoo's action mask: {"clock": {"step":
    Box(1)}, "who": Discrete(num_agents), "note": Text, "action_mask"}. Only "who" says which action
    is rewarded (agent i's is i % 2), through an embedding; the text is left out with a warning."""

    def observation_space(self, agent):
        return spaces.Dict({"clock": spaces.Dict({"step": spaces.Box(0.0, 100.0, (1,), np.float32)}),
                            "who": spaces.Discrete(len(self.possible_agents)), "note": spaces.Text(8),
                            "action_mask": spaces.Box(0, 1, (2,), np.int8)})

    def _obs(self, agent):
        return {"clock": {"step": np.array([self.t], np.float32)}, "who": self.possible_agents.index(agent),
                "note": "relay", "action_mask": np.ones(2, np.int8)}
