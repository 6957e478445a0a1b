"""PPO's record writer (PPO, APPO, MAPPO, IPPO): an env rank's replies become fragments of T steps
x N env rows, with the bootstrap values, episode statistics and the reward-return moments.

Numpy only (env ranks with remote inference never import torch).
"""
from __future__ import annotations

import numpy as np

from hpcrl.core.moments import combine_moments
from hpcrl.core.config import Config
from hpcrl.core.messages import VALUES_ONLY, Message, MessageSpec, take_rows
from hpcrl.core.observations import assign, fit
from hpcrl.envs import RAW_REWARD
from hpcrl.envs.multiagent import ENV_DONE, episode_starts
from hpcrl.workers.env_group import NO_ROWS, EnvGroup, Phase


class FragmentWriter:
    """Fills a fragment of T steps x N env rows; each env group writes its columns. With PettingZoo
    envs the fragment also records which rows were active. With several policies (core/policies.py)
    it fills one fragment of every row and ships each policy the columns of its agents, as a record
    of its own to its own trainer.

    A group makes T+1 policy calls per fragment: the last only asks for the values of the
    observations after step T-1 (and of episodes truncated there), which GAE needs to bootstrap.
    The fragment ships once every group has had that reply. In async mode that reply's actions
    also begin the next fragment, so no call is wasted; sync mode asks again with the next version.
    """

    record_name = "a fragment"

    def __init__(self, cfg: Config, whole_record: MessageSpec | None = None):
        """With several policies, `whole_record` is the layout of a fragment of every row."""
        self.T, self.num_envs = cfg.algo.rollout_length, cfg.env.num_envs
        self.sync = cfg.algo.mode == "sync"
        self.normalize_reward = cfg.env.normalize_reward
        self.whole_record = whole_record
        self.stepping_t = 0  # the step its envs take now (what a hang report names)

    @classmethod
    def build(cls, w) -> FragmentWriter:
        """From the wiring (hpcrl.launch.wiring.Wiring): the layout of a fragment of every row."""
        return cls(w.cfg, whole_record=w.algorithm.record(w.cfg, w.spaces))

    def attach(self, env_rank) -> None:
        self.env_rank = env_rank
        self.groups, self.senders, self.tally = env_rank.groups, env_rank.senders, env_rank.tally
        self.policy_columns = [np.flatnonzero(env_rank.row_policy == p) for p in range(len(self.senders))]
        # one policy: the record is filled in place; several: a fragment of every row, split at shipping
        self.fragment = self.senders[0].current() if len(self.senders) == 1 else self.whole_record.allocate()

    def full(self) -> bool:
        """Every group has had step T's reply."""
        return all(g.phase is Phase.AT_END for g in self.groups)

    in_turns = False  # each group's reply is taken as it arrives

    def stepping(self) -> str:
        return f"stepping envs (step {self.stepping_t})"

    def take_reply(self, group: EnvGroup, reply: Message) -> None:
        """A fragment's step: the reply's actions step the group, or (step T) its values close the
        group's columns of the fragment."""
        frag, cols = self.fragment, group.columns
        if len(group.final_rows):
            rows, values = group.truncation_values(reply)
            frag["trunc_values"][group.t - 1, cols][rows] = values
        if group.t == self.T:
            frag["last_values"][cols] = reply["values"]
            assign(frag["last_obs"], group.request["obs"], cols)
            group.phase = Phase.AT_END
            return
        self._step(group, reply)

    def _step(self, group: EnvGroup, reply: Message) -> None:
        t, frag, cols = group.t, self.fragment, group.columns
        if group.seats is not None and group.seats.anchors:  # the anchors' seats act for themselves
            group.seats.play_anchors(group.request["obs"], group.request["action_mask"] if group.masked else None,
                                     reply["actions"])
        if t == 0:
            group.first_version = reply.get("version")
            if group.recurrent:  # the state the fragment's sequences start from
                frag["init_state"][cols] = reply["state"]
        if group.recurrent:  # the rows whose state the holder zeroed before this step's actions
            frag["starts"][t, cols] = group.request["starts"]
        assign(frag["obs"], group.request["obs"], (t, cols))
        frag["actions"][t, cols] = reply["actions"]
        frag["logp"][t, cols] = reply["logp"]
        frag["values"][t, cols] = reply["values"]
        if group.active is not None:  # a frozen pool member's seats are no one's training data
            frag["active"][t, cols] = group.active if group.seats is None else group.active & group.seats.learning
        if group.masked:
            frag["action_mask"][t, cols] = group.request["action_mask"]
        self.stepping_t = t
        obs, rewards, terminated, truncated, info = group.envs.step(reply["actions"])
        if group.active is not None:
            group.active = info["active"]
        if group.masked:
            group.request["action_mask"][...] = info["action_mask"]
        done = terminated | truncated
        frag["rewards"][t, cols] = rewards
        frag["dones"][t, cols] = done
        frag["trunc_values"][t, cols] = 0.0
        obs = fit(group.request["obs"], obs)  # Dict and Tuple observations: their leaves by key
        assign(group.request["obs"], obs)
        # Truncated (not terminated) episodes still have a future: send their final obs for a value.
        group.carry_final_obs(truncated & ~terminated, obs, info)
        self.tally.add(group, rewards, done, info)
        if group.seats is not None:  # games that ended are judged; the next ones get their seats
            group.seats.stepped(info.get(RAW_REWARD, rewards), info[ENV_DONE])
        if group.recurrent:  # the fragment keeps them (frag["starts"]): the trainer zeroes the same rows
            group.request["starts"][...] = episode_starts(done, info)
        group.t += 1
        # At once: its round trip overlaps the other groups' steps. Sync mode's call after step T
        # only bootstraps (the next fragment asks again with these observations and a new version).
        group.submit(self.env_rank.version, VALUES_ONLY if self.sync and group.t == self.T else 0)

    def ship(self, header: dict) -> None:
        if self.normalize_reward:  # the trainers scale rewards by the std of every env rank's returns
            self.fragment["return_moments"][:] = combine_moments([g.envs.take_moments() for g in self.groups])
        if "selfplay" in self.fragment.arrays:  # games against the pool, by age
            self.fragment["selfplay"][...] = sum(g.seats.take_results() for g in self.groups)
        several = len(self.senders) > 1
        for p, sender in enumerate(self.senders):
            record = sender.current()  # one policy: the fragment itself
            if several:  # this policy's agents' columns of the fragment of every row
                take_rows(self.fragment, record, self.policy_columns[p])
            record["episode_stats"][:] = self.tally.stats[p]
            record.set(**header, policy_id=p, version=min(g.first_version for g in self.groups),
                       frames=self.T * self.num_envs)
            current = sender.send()
        if not several:
            self.fragment = current

    def between_records(self) -> bool:
        return all(g.t == 0 for g in self.groups)

    def serial_parts(self) -> dict | None:
        """Sync mode: the groups hold it all. Async mode steps the next fragment as one ships, so
        no point between fragments is one an uninterrupted run rests at."""
        return {} if self.sync else None

    def next_record(self) -> None:
        for group in self.groups:
            group.t, group.phase = 0, Phase.READY
            group.final_rows = NO_ROWS
            if not self.sync:  # async: the end-of-fragment reply's actions begin the next fragment
                self._step(group, group.reply)
