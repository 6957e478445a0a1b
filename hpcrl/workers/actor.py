"""Env rank (actor): steps gymnasium vectors, asks a policy for actions, ships fragments.

Never imports torch: the policy is either remote (`RemotePolicy`, over MPI) or an inline policy
object handed in by the wiring (workers/policy_server.py), the only side that needs torch.
"""
from __future__ import annotations

import time

import numpy as np

from hpcrl.core.moments import combine_moments
from hpcrl.runtime.comm import RequestClient
from hpcrl.runtime.streams import SampleSender
from hpcrl.core.config import Config
from hpcrl.core.layout import INLINE, fragments_per_env_rank
from hpcrl.envs import GAME_OVER, RAW_REWARD, make_vector_env, state
from hpcrl.core.seeds import env_seeds, seed_for
from hpcrl.core.observations import apply, assign, combine, fit, take
from hpcrl.core.observations import count_rows
from hpcrl.core.messages import EPISODE_STATS, STOP, VALUES_ONLY, Message, MessageSpec, take_rows
from hpcrl.core.policies import row_policies
from hpcrl.envs.multiagent import ENV_DONE, episode_starts
from hpcrl.workers.selfplay import Seats


NO_ROWS, NO_TRUNCATED = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)  # no final observations to send
NO_ROWS.flags.writeable = NO_TRUNCATED.flags.writeable = False  # shared by every group


def _as_arrays(sampling_state):
    """A policy's sampling state as numpy arrays: a torch generator's state is a CPU byte tensor,
    which np.asarray views in place, so a restore writes into the tensor handed back to the policy."""
    if sampling_state is None:
        return None
    return {k: np.asarray(v) for k, v in sampling_state.items()} if isinstance(sampling_state, dict) \
        else np.asarray(sampling_state)


def _not_restored(why: str) -> None:
    print(f"[hpcrl] warning: the checkpoint's env state was not restored: {why}; the resumed serial run "
          f"starts new episodes", flush=True)


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


class EnvGroup:
    """One slice of the rank's envs with its own vector and its own policy channel. While one
    group waits for its actions another steps (double buffering, as SRL's env ring): the env rank
    hides the inference round trip behind env work."""

    def __init__(self, envs, first_obs: np.ndarray, policy, columns: slice, row_policy: np.ndarray):
        self.envs, self.policy, self.columns = envs, policy, columns
        self.request, self.reply = policy.request, policy.reply
        assign(self.request["obs"], fit(self.request["obs"], first_obs))
        self.row_policy = row_policy  # the policy id of each row (they ride on requests in runs of several)
        if "policy" in self.request.arrays:
            self.request["policy"][...] = row_policy
        self.seats: Seats | None = None  # self-play against a pool: who plays which seat (workers/selfplay.py)
        n = count_rows(self.request["obs"])
        self.t = 0
        self.waiting = False
        self.at_end = False  # took step T's reply (values for the bootstrap); waits for the other groups
        self.first_version = -1  # policy version of this group's first step in the current fragment
        self.stopped = False  # has had its STOP reply
        self.ep_return = np.zeros(n, dtype=np.float64)
        self.ep_length = np.zeros(n, dtype=np.int64)
        # rows whose final obs rides on the next request, and which of them were truncated (the
        # others complete a PettingZoo env for the centralised critic)
        self.final_rows, self.final_truncated = NO_ROWS, NO_TRUNCATED
        # PettingZoo envs (a row per agent): the rows whose agent acts on the current observations
        self.active = getattr(envs.unwrapped, "active", None)
        self.masked = "action_mask" in self.request.arrays  # the env gives each row's valid actions
        if self.masked:
            self.request["action_mask"][...] = envs.unwrapped.action_mask
        # a recurrent policy: which rows begin an episode (all, at first), for the holder to zero their state
        self.recurrent = "starts" in self.request.arrays
        if self.recurrent:
            self.request["starts"][...] = 1

    def submit(self, version: int, flags: int = 0) -> None:
        self.policy.submit(version, len(self.final_rows), flags)
        self.waiting = True

    def truncation_values(self, reply: Message) -> tuple[np.ndarray, np.ndarray]:
        """The rows the last step truncated and their final observations' values, from the reply to
        the request that carried those observations (the other final rows complete PettingZoo envs)."""
        values = reply["final_values"][:len(self.final_rows)]
        return self.final_rows[self.final_truncated], values[self.final_truncated]


class EnvRole:
    """Collects fragments of T steps x N envs and ships each to its learner. With PettingZoo envs
    each agent is a row of the vector (envs/multiagent.py), so N counts agent rows; the fragment
    also records which rows were active, and a frame is still one env step.

    The N envs are split into `groups` that step independently, each writing its columns of the
    fragment. With several policies (core/policies.py) the rank fills one fragment of every row
    and ships each policy the columns of its agents, as a record of its own to its own trainer.
    A group makes T+1 policy calls per fragment: the last only asks for the values of the
    observations after step T-1 (and of episodes truncated there), which GAE needs to
    bootstrap. The fragment ships once every group has had that reply.
    Sync mode: the rank collects `fragments_per_version` fragments (1 unless algo.batch_frames
    says more) with policy version v, then waits for v+1.
    Async mode: every request takes the newest version the policy has (at least the start
    version), so the (T+1)-th reply's actions also begin the next fragment: no call is wasted and
    the rank never waits for the learner.
    """

    name = "env"

    def __init__(self, cfg: Config, rank: int, index: int, policies: list, senders: list[SampleSender],
                 start_version: int = 0, fragments_per_version: int = 1, control=None,
                 whole_record: MessageSpec | None = None, agents: tuple = ()):
        """`policies`: a policy channel per env group. `senders`: one per policy, to the trainer of
        that policy. `fragments_per_version`: sync mode, fragments collected with each policy version
        (hpcrl.core.layout.fragments_per_env_rank). `control`: the rank's control stream, whose
        stop word ends the rollout (None: only a STOP reply does, as in tests that drive an actor
        alone). With several senders, `whole_record` is the layout of a fragment of every row and
        `agents` the env's agent names, which cfg.policies maps to policies."""
        self.rank = rank
        self.control = control
        self.T, self.num_envs = cfg.algo.rollout_length, cfg.env.num_envs
        self.sync = cfg.algo.mode == "sync"
        self.normalize_reward = cfg.env.normalize_reward
        self.senders = senders
        self.sender = senders[0]
        per_group = self.num_envs // len(policies)
        rows = count_rows(policies[0].request["obs"])  # a group's rows: its envs, or envs x agents (PettingZoo)
        self.N = rows * len(policies)  # the record's columns
        row_policy = row_policies(cfg.policies, agents, self.num_envs)
        self.policy_columns = [np.flatnonzero(row_policy == p) for p in range(len(senders))]
        self.episode_stats = np.zeros((len(senders), len(EPISODE_STATS)))  # per policy, of its agents' episodes
        self.groups = []
        for g, policy in enumerate(policies):
            envs, first_obs = make_vector_env(cfg.env, seed=env_seeds(cfg.run.seed, index, g, per_group),
                                              gamma=cfg.algo.gamma, num_envs=per_group)
            columns = slice(g * rows, (g + 1) * rows)
            group = EnvGroup(envs, first_obs, policy, columns, row_policy[columns])
            if cfg.algo.selfplay.pool:
                group.seats = Seats(cfg, per_group, rows // per_group,
                                    np.random.default_rng(seed_for(cfg.run.seed, "selfplay", index, g)),
                                    first_pool_id=len(senders))
                group.request["policy"][...] = group.seats.row_policy
            self.groups.append(group)
        # sync: the version this rollout must be collected with; async: the oldest version accepted
        self.version = start_version
        self.fragments_per_version = fragments_per_version  # sync (hpcrl.core.layout.fragments_per_env_rank)
        self.version_fragments = 0  # sync: fragments sent with self.version so far
        self.done = False
        self.stopping = False  # the stop word is in: every group collects its STOP reply, then finish
        self.fragments_sent = 0
        # one policy: the record is filled in place; several: a fragment of every row, split at shipping
        self.fragment = senders[0].current() if len(senders) == 1 else whole_record.allocate()
        self.said_goodbye = False
        self.credit_wait_since: float | None = None  # a finished fragment waits for a credit
        self.rollout_start = time.perf_counter()
        self.waited = 0.0  # seconds of this rollout in which every group was waiting for actions
        self.idle_since: float | None = None
        self.status = "starting"
        self._reset_stats()

    @classmethod
    def actor_class(cls, cfg: Config) -> type:
        """The actor class for this config (a subclass may pick one by the network)."""
        return cls

    @classmethod
    def build(cls, w) -> "EnvRole":
        """From the wiring (hpcrl.runtime.wiring.Wiring): its policy (a policy server's channels, one
        per env group, or an inline policy) and its sender to the trainer."""
        index = w.layout.index_in("env", w.rank)
        return cls(w.cfg, w.rank, index, cls.policies(w, index), cls.senders(w, index),
                   start_version=w.start.start_version,
                   fragments_per_version=fragments_per_env_rank(w.cfg, w.layout), control=w.control,
                   whole_record=w.algorithm.record(w.cfg, w.spaces), agents=w.spaces.agents)

    @staticmethod
    def policies(w, index: int) -> list:
        """Env rank number `index`'s policy: its policy server's channels, one per env group, or
        an inline policy (with inference: {ranks: 0}, and in serial mode)."""
        server = int(w.layout.env_inference[index])
        if server == INLINE:
            from hpcrl.workers.policy_server import InlinePolicy  # torch: only env ranks that hold a policy
            return [InlinePolicy.build(w, index)]
        return [RemotePolicy(w.inference.client(server, group=g)) for g in range(w.groups)]

    @staticmethod
    def senders(w, index: int) -> list[SampleSender]:
        """Env rank number `index`'s ends of the sample streams: one per policy, to its trainer."""
        return [stream.sender(int(w.layout.env_learners[p, index])) for p, stream in enumerate(w.sample)]

    def _reset_stats(self) -> None:
        stats = self.episode_stats
        stats[:] = 0
        stats[:, EPISODE_STATS.index("return_min")] = np.inf
        stats[:, EPISODE_STATS.index("return_max")] = -np.inf

    def poll(self) -> int:
        if not self.stopping and self.control is not None and self.control.stopped:
            self.stopping = True
        if self.stopping:
            return self._stop_groups()
        work = 0
        for group in self.groups:
            if not group.waiting and not group.at_end:
                group.submit(self.version)
            work += self._poll_group(group)
            if self.stopping:
                return work + self._stop_groups()
        if self._record_full():
            blocked = next((s for s in self.senders if not s.can_send()), None)
            if blocked is None:
                self._ship()
                work += 1
            else:  # flow control: a trainer has no free slot yet (a wait on a peer)
                if self.credit_wait_since is None:
                    self.credit_wait_since = time.perf_counter()
                    self.status = (f"waiting for a credit from its trainer (rank {blocked.peer}) to send "
                                   f"{self.record_name}")
                return work
        self._account_wait(work)
        return work

    record_name = "a fragment"  # what ships, for the status line

    def _record_full(self) -> bool:
        """The record must ship before any group steps on: every group has had step T's reply."""
        return all(g.at_end for g in self.groups)

    def _account_wait(self, work: int) -> None:
        """Time in which no group had anything to step (what double buffering is meant to hide)
        runs from the first poll that found nothing to the next reply."""
        if not work and self.idle_since is None:
            self.idle_since = time.perf_counter()
            self.status = f"waiting for actions (policy version {self.version}, step {self.groups[0].t})"

    def _reply_arrived(self) -> None:
        if self.idle_since is not None:
            self.waited += time.perf_counter() - self.idle_since
            self.idle_since = None

    def _poll_group(self, group: EnvGroup) -> int:
        if not group.waiting or self._record_full():
            return 0  # a reply that came while the record is full waits in its buffer until it ships
        reply = group.policy.poll()
        if reply is None:
            return 0
        self._reply_arrived()
        group.waiting = False
        if reply.get("flags") & STOP:  # the policy side heard the stop word first
            group.stopped = self.stopping = True
            return 1
        self._take_reply(group, reply)
        return 1

    def _take_reply(self, group: EnvGroup, reply: Message) -> None:
        """A fragment's step: the reply's actions step the group, or (step T) its values close the
        group's columns of the fragment."""
        if self.sync and reply.get("version") != self.version:
            raise RuntimeError(f"env rank {self.rank}: sync mode got actions from policy version "
                               f"{reply.get('version')} while collecting with version {self.version}")
        frag, cols = self.fragment, group.columns
        if len(group.final_rows):
            rows, values = group.truncation_values(reply)
            frag["trunc_values"][group.t - 1, cols][rows] = values
        if group.t == self.T:
            frag["last_values"][cols] = reply["values"]
            assign(frag["last_obs"], group.request["obs"], cols)
            group.at_end = True
            return
        self._step(group, reply)

    def _step(self, group: EnvGroup, reply: Message) -> None:
        t, frag, cols = group.t, self.fragment, group.columns
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
        self.status = f"stepping envs (step {t})"
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
        self._final_rows(group, truncated & ~terminated, obs, info)
        self._tally(group, rewards, done, info)
        if group.seats is not None:  # games that ended are judged; the next ones get their seats
            group.seats.stepped(info.get(RAW_REWARD, rewards), info[ENV_DONE])
            group.request["policy"][...] = group.seats.row_policy
        if group.recurrent:  # the fragment keeps them (frag["starts"]): the trainer zeroes the same rows
            group.request["starts"][...] = episode_starts(done, info)
        group.t += 1
        # At once: its round trip overlaps the other groups' steps. Sync mode's call after step T
        # only bootstraps (the next fragment asks again with these observations and a new version).
        group.submit(self.version, VALUES_ONLY if self.sync and group.t == self.T else 0)

    def _final_rows(self, group: EnvGroup, truncated: np.ndarray, obs: np.ndarray, info: dict) -> None:
        """The rows whose final observations the next request carries. PettingZoo envs (a row per
        agent) send every agent of an env with a truncated agent, so a centralised critic sees the
        whole env: an agent's final observation if it ended in this step, else its current one."""
        if not truncated.any():  # nearly every step: nothing rides on the next request
            group.final_rows, group.final_truncated = NO_ROWS, NO_TRUNCATED
            return
        rows = np.flatnonzero(truncated)
        if group.active is not None:
            agents = group.envs.unwrapped.num_agents
            rows = (np.unique(rows // agents)[:, None] * agents + np.arange(agents)).reshape(-1)
        group.final_rows, group.final_truncated = rows, truncated[rows]
        if group.recurrent:  # their values come from the states their episodes ended in
            group.request["final_rows"][:len(rows)] = rows
        if "final_policy" in group.request.arrays:
            group.request["final_policy"][:len(rows)] = group.row_policy[rows]
        ended = info.get("_final_obs", np.zeros(count_rows(obs), dtype=bool))
        finals = [fit(obs, info["final_obs"][r]) if ended[r] else take(obs, r) for r in rows]
        assign(group.request["final_obs"], combine(np.stack, finals), slice(0, len(rows)))

    def _tally(self, group: EnvGroup, rewards: np.ndarray, done: np.ndarray, info: dict) -> None:
        """Metrics: raw rewards over whole episodes (an Atari game of several lives), when training
        sees clipped or normalised rewards and life losses as ends (hpcrl/envs/)."""
        group.ep_return += info.get(RAW_REWARD, rewards)
        group.ep_length += 1
        ended = info.get(GAME_OVER, done)
        if ended.any():
            rows = np.flatnonzero(ended)
            if group.seats is not None:  # the pool's seats: their episodes are not the policy's
                frozen = rows[~group.seats.learning[rows]]
                group.ep_return[frozen], group.ep_length[frozen] = 0.0, 0
                rows = rows[group.seats.learning[rows]]
            self._count_episodes(group, rows)

    def _count_episodes(self, group: EnvGroup, ended: np.ndarray) -> None:
        for p, stats in enumerate(self.episode_stats):
            mine = ended if len(self.episode_stats) == 1 else ended[group.row_policy[ended] == p]
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

    def _ship(self) -> None:
        now = time.perf_counter()
        credit_wait = now - self.credit_wait_since if self.credit_wait_since is not None else 0.0
        self.credit_wait_since = None
        if self.normalize_reward:  # the trainers scale rewards by the std of every env rank's returns
            self.fragment["return_moments"][:] = combine_moments([g.envs.take_moments() for g in self.groups])
        if "selfplay" in self.fragment.arrays:  # games against the pool, by age
            self.fragment["selfplay"][...] = sum(g.seats.take_results() for g in self.groups)
        several = len(self.senders) > 1
        for p, sender in enumerate(self.senders):
            record = sender.current()  # one policy: the fragment itself
            if several:  # this policy's agents' columns of the fragment of every row
                take_rows(self.fragment, record, self.policy_columns[p])
            record["episode_stats"][:] = self.episode_stats[p]
            record.set(policy_id=p, env_rank=self.rank, version=min(g.first_version for g in self.groups),
                       index=self.fragments_sent, frames=self.T * self.num_envs, flags=0,
                       rollout_us=int(1e6 * (now - self.rollout_start)), wait_us=int(1e6 * self.waited),
                       credit_wait_us=int(1e6 * credit_wait))
            current = sender.send()
        if not several:
            self.fragment = current
        self.fragments_sent += 1
        if self.sync:  # the next version only once this one's share of the batch is sent
            self.version_fragments += 1
            if self.version_fragments == self.fragments_per_version:
                self.version, self.version_fragments = self.version + 1, 0
        self.rollout_start, self.waited = time.perf_counter(), 0.0
        self._reset_stats()
        for group in self.groups:
            group.t, group.at_end = 0, False
            group.final_rows = NO_ROWS
            if not self.sync:  # async: the end-of-fragment reply's actions begin the next fragment
                self._step(group, group.reply)

    def _stop_groups(self) -> int:
        """The inference side answers one request per group with STOP before it closes: make sure
        every group has asked (again, if its last reply was an ordinary one) and had that answer."""
        work = 0
        for group in self.groups:
            if group.stopped:
                continue
            if not group.waiting:
                group.submit(self.version)
                continue
            reply = group.policy.poll()
            if reply is not None:
                group.waiting = False
                group.stopped = bool(reply.get("flags") & STOP)
                work += 1
        if all(g.stopped for g in self.groups):
            work += self._say_goodbye()
        return work

    def _say_goodbye(self) -> int:
        """The last record to the trainer (it needs a credit like any other), then wait for the
        trainer's farewell, after which no message to this rank is in flight."""
        if not self.said_goodbye:
            if not all(s.can_send() for s in self.senders):
                self.status = "stopping: waiting for a credit to say goodbye to the trainer"
                return 0
            for sender in self.senders:
                sender.say_goodbye(self.rank)
            self.said_goodbye = True
            self.status = "stopping: waiting for the trainer's farewell"
            return 1
        if not all(s.closed() for s in self.senders):
            return 0
        if not all(group.policy.finished() for group in self.groups):  # inline: the weights' END
            self.status = "stopping: waiting for the parameter stream's last version"
            return 0
        self._finish()
        return 1

    def _saved_parts(self) -> tuple[dict, list]:
        """What a serial checkpoint holds of this rank, as the live objects and arrays themselves:
        `state.capture` reads them and `state.restore` writes into them. Also each group's policy
        sampling state as the policy gives it (`parts` views its arrays)."""
        sampling = [g.policy.sampling_state() for g in self.groups]
        parts = {"groups": [{"envs": g.envs, "obs": g.request["obs"], "ep_return": g.ep_return,
                             "ep_length": g.ep_length, "active": g.active,
                             "mask": g.request["action_mask"] if g.masked else None,
                             "starts": g.request["starts"] if g.recurrent else None,
                             "sampling": _as_arrays(s)} for g, s in zip(self.groups, sampling)],
                 "version": self.version, "version_fragments": self.version_fragments,
                 "fragments_sent": self.fragments_sent}
        return parts, sampling

    def snapshot(self) -> dict:
        """Serial mode: everything needed to continue exactly, taken between rollouts (when the
        learner checkpoints), as data the checkpoint stores without pickle: {"tree": the JSON text
        as uint8, "arrays": {key: array}} (hpcrl/envs/state.py). NotCapturable for envs whose
        state is not plain data."""
        if any(g.t != 0 for g in self.groups):
            raise RuntimeError("env snapshots are taken between rollouts")
        tree, arrays = state.capture(self._saved_parts()[0])
        return {"tree": np.frombuffer(tree.encode(), dtype=np.uint8), "arrays": arrays}

    def restore(self, saved) -> None:
        """Continue from a snapshot into the envs this run built from its config. One that cannot
        be restored leaves every group as built (new episodes, as an MPI run resumes) with a warning."""
        if not isinstance(saved, dict):  # a uint8 array: the pickle that checkpoints held before issue 25
            return _not_restored("it is in the old pickled format, which runs code when loaded, so it was not loaded")
        parts, sampling = self._saved_parts()
        try:
            tree = np.asarray(saved.get("tree"), dtype=np.uint8).tobytes().decode()
            state.restore(parts, tree, saved.get("arrays") or {})
        except (state.StateMismatch, UnicodeDecodeError, TypeError) as exc:
            return _not_restored(str(exc))
        for group, policy_state in zip(self.groups, sampling):
            group.policy.restore_sampling_state(policy_state)  # its arrays were written in place
        self.version, self.fragments_sent = parts["version"], parts["fragments_sent"]
        self.version_fragments = parts["version_fragments"]

    def _finish(self) -> None:
        for sender in self.senders:
            sender.close()
        for group in self.groups:
            group.policy.close()
            group.envs.close()
        self.done = True
        self.status = "finished"
