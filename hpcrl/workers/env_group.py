"""An env rank's env groups: slices of its envs, each with its own vector and its own policy
channel, where they stand in the exchange with that policy, and the episode statistics of a record.

Never imports torch: a group's policy is either remote (`RemotePolicy`, over MPI) or an inline
policy object handed in by the wiring (workers/policy_server.py), the only side that needs torch.
"""
from __future__ import annotations

import enum

import numpy as np

from hpcrl.core.config import Config
from hpcrl.core.messages import EPISODE_STATS, VALUES_ONLY, Message
from hpcrl.core.observations import assign, combine, fit, take
from hpcrl.core.observations import count_rows
from hpcrl.core.seeds import env_seeds, seed_for
from hpcrl.envs import GAME_OVER, RAW_REWARD, make_vector_env
from hpcrl.envs.scripted import anchor_players
from hpcrl.runtime.comm import RequestClient
from hpcrl.workers.selfplay import Seats

NO_ROWS, NO_TRUNCATED = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)  # no final observations to send
NO_ROWS.flags.writeable = NO_TRUNCATED.flags.writeable = False  # shared by every group


class RemotePolicy:
    """Actions from an inference rank: the request goes out as one message, the reply is polled."""

    def __init__(self, client: RequestClient):
        self.client = client
        self.request, self.reply = client.request, client.reply

    def submit(self, version: int, n_final: int, flags: int = 0) -> None:
        self.request.set(version=version, n_final=n_final, flags=flags)
        self.client.send(self.request.spec.prefix_nbytes("final_obs", n_final))

    def poll(self) -> Message | None:
        return self.reply if self.client.test() else None

    def finished(self) -> bool:
        return True  # the STOP reply was the inference stream's last message to this group

    def close(self) -> None:
        self.client.close()

    def sampling_state(self):
        return None  # sampling happens on the inference rank

    def restore_sampling_state(self, state) -> None:
        pass

    def row_state(self) -> dict:
        return {}  # a recurrent policy's hidden states live on the inference rank


class Phase(enum.Enum):
    """Where a group stands with its policy: exactly one of these at a time."""

    READY = "ready"  # no request out: the env rank sends the next one
    WAITING = "waiting"  # its request is out; the reply is polled
    AT_END = "at the record's end"  # took the record's last reply (PPO: step T's values); waits for it to ship
    STOPPED = "stopped"  # had its STOP reply, the inference stream's last message to this group


class EnvGroup:
    """One slice of the rank's envs with its own vector and its own policy channel. While one
    group waits for its actions another steps (double buffering, as SRL's env ring): the env rank
    hides the inference round trip behind env work.

    Its progress is one `Phase`. Whether its env gives action masks (`masked`) and whether its
    policy is recurrent (`recurrent`) are read-only properties: the request's layout fixes them
    for the group's life, so they are what the group is, not where it stands."""

    def __init__(self, index: int, envs, first_obs: np.ndarray, policy, columns: slice, row_policy: np.ndarray,
                 first_row: int = 0):
        """`first_row`: the global index of the group's first row among all of the run's env rows."""
        self.index = index  # the group's number on its env rank
        self.envs, self.policy, self.columns = envs, policy, columns
        self.request, self.reply = policy.request, policy.reply
        assign(self.request["obs"], fit(self.request["obs"], first_obs))
        self.row_policy = row_policy  # the policy id of each row (they ride on requests in runs of several)
        if "policy" in self.request.arrays:
            self.request["policy"][...] = row_policy
        self.seats: Seats | None = None  # self-play against a pool: who plays which seat (workers/selfplay.py)
        n = count_rows(self.request["obs"])
        self.request.set(row0=first_row)
        self.steps = 0  # action steps asked for since the run began (EnvRank sets it on a resume)
        self.phase = Phase.READY
        self.t = 0  # PPO: the fragment's step this group takes next (DQN's windows count their own)
        self.first_version = -1  # policy version of this group's first step in the current fragment
        self.ep_return = np.zeros(n, dtype=np.float64)
        self.ep_length = np.zeros(n, dtype=np.int64)
        # rows whose final obs rides on the next request, and which of them were truncated (the
        # others complete a PettingZoo env for the centralised critic)
        self.final_rows, self.final_truncated = NO_ROWS, NO_TRUNCATED
        # PettingZoo envs (a row per agent): the rows whose agent acts on the current observations
        self.active = getattr(envs.unwrapped, "active", None)
        if self.masked:
            self.request["action_mask"][...] = envs.unwrapped.action_mask
        if self.recurrent:  # every row begins an episode, for the holder to zero its state
            self.request["starts"][...] = 1

    @property
    def masked(self) -> bool:
        """The env gives each row's valid actions."""
        return "action_mask" in self.request.arrays

    @property
    def recurrent(self) -> bool:
        """A recurrent policy: requests say which rows begin an episode (`starts`)."""
        return "starts" in self.request.arrays

    def submit(self, version: int, flags: int = 0) -> None:
        """Ask for the actions of action step `self.steps` (which keys the holder's draws); a call
        for values only (VALUES_ONLY) takes no step."""
        self.request.set(step=self.steps)
        self.policy.submit(version, len(self.final_rows), flags)
        self.steps += 0 if flags & VALUES_ONLY else 1
        self.phase = Phase.WAITING

    def next_step(self) -> int:
        """The step of the group's next action yet to be drawn: its request's, if that is out (or
        was answered with STOP, which draws nothing)."""
        return self.request.get("step") if self.phase in (Phase.WAITING, Phase.STOPPED) else self.steps

    def truncation_values(self, reply: Message) -> tuple[np.ndarray, np.ndarray]:
        """The rows the last step truncated and their final observations' values, from the reply to
        the request that carried those observations (the other final rows complete PettingZoo envs)."""
        values = reply["final_values"][:len(self.final_rows)]
        return self.final_rows[self.final_truncated], values[self.final_truncated]

    def carry_final_obs(self, truncated: np.ndarray, obs, info: dict) -> None:
        """The rows whose final observations the next request carries: those of episodes `truncated`
        (not terminated) in the last step, which still have a future to value. PettingZoo envs (a row
        per agent) send every agent of an env with a truncated agent, so a centralised critic sees
        the whole env: an agent's final observation if it ended in this step, else its current one."""
        if not truncated.any():  # nearly every step: nothing rides on the next request
            self.final_rows, self.final_truncated = NO_ROWS, NO_TRUNCATED
            return
        rows = np.flatnonzero(truncated)
        if self.active is not None:
            agents = self.envs.unwrapped.num_agents
            rows = (np.unique(rows // agents)[:, None] * agents + np.arange(agents)).reshape(-1)
        self.final_rows, self.final_truncated = rows, truncated[rows]
        if self.recurrent:  # their values come from the states their episodes ended in
            self.request["final_rows"][:len(rows)] = rows
        if "final_policy" in self.request.arrays:
            self.request["final_policy"][:len(rows)] = self.row_policy[rows]
        ended = info.get("_final_obs", np.zeros(count_rows(obs), dtype=bool))
        finals = [fit(obs, info["final_obs"][r]) if ended[r] else take(obs, r) for r in rows]
        assign(self.request["final_obs"], combine(np.stack, finals), slice(0, len(rows)))


def make_groups(cfg: Config, index: int, policies: list, row_policy: np.ndarray, num_policies: int) -> list[EnvGroup]:
    """Env rank number `index`'s groups, one per policy channel, each with its own seeded vector of
    num_envs / groups envs (and, with a self-play pool, its seats). `row_policy`: the policy id of
    every row of the rank; `num_policies`: the training policies (pool members come after them)."""
    per_group = cfg.env.num_envs // len(policies)
    rows = count_rows(policies[0].request["obs"])  # a group's rows: its envs, or envs x agents (PettingZoo)
    groups = []
    anchors = anchor_players(cfg.algo.selfplay)
    for g, policy in enumerate(policies):
        # the global index of the group's first env: env ranks in order, each rank's groups in order
        first_env = index * cfg.env.num_envs + g * per_group
        envs, first_obs = make_vector_env(cfg.env, seed=env_seeds(cfg.run.seed, first_env, per_group),
                                          gamma=cfg.algo.gamma, num_envs=per_group)
        columns = slice(g * rows, (g + 1) * rows)
        group = EnvGroup(g, envs, first_obs, policy, columns, row_policy[columns],
                         first_row=first_env * (rows // per_group))
        if cfg.algo.selfplay.opponents_count:
            group.seats = Seats(cfg, per_group, rows // per_group,
                                np.random.default_rng(seed_for(cfg.run.seed, "selfplay", index, g)),
                                first_pool_id=num_policies, anchors=anchors,
                                row_policy=group.request["policy"] if "policy" in group.request.arrays else None)
        groups.append(group)
    return groups


class EpisodeTally:
    """The episode statistics (EPISODE_STATS) of the record being filled, per policy, of its
    agents' episodes: raw rewards over whole episodes (an Atari game of several lives), when
    training sees clipped or normalised rewards and life losses as ends (hpcrl/envs/)."""

    def __init__(self, num_policies: int):
        self.stats = np.zeros((num_policies, len(EPISODE_STATS)))
        self.reset()

    def reset(self) -> None:
        self.stats[:] = 0
        self.stats[:, EPISODE_STATS.index("return_min")] = np.inf
        self.stats[:, EPISODE_STATS.index("return_max")] = -np.inf

    def add(self, group: EnvGroup, rewards: np.ndarray, done: np.ndarray, info: dict) -> None:
        """One step of `group`: its rewards, and the episodes that ended in it."""
        group.ep_return += info.get(RAW_REWARD, rewards)
        group.ep_length += 1
        ended = info.get(GAME_OVER, done)
        if ended.any():
            rows = np.flatnonzero(ended)
            if group.seats is not None:  # the pool's seats: their episodes are not the policy's
                frozen = rows[~group.seats.learning[rows]]
                group.ep_return[frozen], group.ep_length[frozen] = 0.0, 0
                rows = rows[group.seats.learning[rows]]
            self._count(group, rows)

    def _count(self, group: EnvGroup, ended: np.ndarray) -> None:
        for p, stats in enumerate(self.stats):
            mine = ended if len(self.stats) == 1 else ended[group.row_policy[ended] == p]
            if not len(mine):
                continue
            returns = group.ep_return[mine]
            stats[0] += len(mine)
            stats[1] += returns.sum()
            stats[2] += (returns ** 2).sum()
            stats[3] = min(stats[3], returns.min())
            stats[4] = max(stats[4], returns.max())
            stats[5] += group.ep_length[mine].sum()
        group.ep_return[ended] = 0.0
        group.ep_length[ended] = 0
