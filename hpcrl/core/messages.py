"""Fixed-layout messages: a struct of arrays in one contiguous, preallocated byte buffer.

Every hot-path message (observation request, action reply, trajectory fragment, weights) is one
`Message`: an int64 header followed by named arrays at 8-byte-aligned offsets. Sender and receiver
build the same `MessageSpec` from the config, so no shapes or pickles travel with the data, and
one MPI call moves the whole buffer. Pure numpy: the comm layer only sees `Message.buffer`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np

from hpcrl.core.observations import ObsLeaves

ALIGN = 8


@dataclass(frozen=True)
class Field:
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return int(np.dtype(self.dtype).itemsize * int(np.prod(self.shape, dtype=np.int64)))


class MessageSpec:
    """Names and places the header words and arrays of one message kind."""

    def __init__(self, header: Iterable[str], fields: Iterable[tuple[str, object, tuple[int, ...]]]):
        self.header = tuple(header)
        self.fields = tuple(Field(n, np.dtype(d), tuple(int(s) for s in shape)) for n, d, shape in fields)
        names = list(self.header) + [f.name for f in self.fields]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate names in message spec: {names}")
        self.offsets: dict[str, int] = {}
        self._by_name = {f.name: f for f in self.fields}
        self._prefix_field: dict[str, str] = {}
        # bytes per row of each field (its first axis): a partial send is worked out per step
        self._row_bytes = {f.name: f.nbytes // max(f.shape[0], 1) if f.shape else f.nbytes for f in self.fields}
        offset = 8 * len(self.header)
        for f in self.fields:
            self.offsets[f.name] = offset
            offset += -(-f.nbytes // ALIGN) * ALIGN
        self.nbytes = offset

    def field(self, name: str) -> Field:
        return self._by_name[name]

    def group(self, name: str) -> list[Field]:
        """Field `name`, or the fields `name.*` of a structured observation, in order."""
        return [f for f in self.fields if f.name == name or f.name.startswith(name + ".")]

    def group_offset(self, name: str) -> int:
        """Where field `name` (or its group's first field) starts."""
        return self.offsets[self.group(name)[0].name]

    def prefix_nbytes(self, name: str, rows: int) -> int:
        """Bytes up to and including the first `rows` rows of field `name` (sends a partial tail);
        of a group of fields (a structured observation), every field but the last whole."""
        last = self._prefix_field.get(name)
        if last is None:
            last = self._prefix_field[name] = self.group(name)[-1].name
        return self.offsets[last] + rows * self._row_bytes[last]

    def allocate(self) -> "Message":
        return Message(self)


class Message:
    """One preallocated buffer with named numpy views onto it."""

    def __init__(self, spec: MessageSpec):
        self.spec = spec
        self.buffer = np.zeros(spec.nbytes, dtype=np.uint8)
        self.header = self.buffer[: 8 * len(spec.header)].view(np.int64)
        self._header_index = {name: i for i, name in enumerate(spec.header)}
        self.arrays: dict[str, np.ndarray] = {}
        # structured observations (core/observations.py): fields 'obs.image', 'obs.direction', ...
        # read together as msg['obs'], a dict of the leaves by key
        self.groups: dict[str, dict[str, np.ndarray]] = {}
        for f in spec.fields:
            start = spec.offsets[f.name]
            self.arrays[f.name] = self.buffer[start:start + f.nbytes].view(f.dtype).reshape(f.shape)
            if "." in f.name:
                group, key = f.name.split(".", 1)
                self.groups.setdefault(group, {})[key] = self.arrays[f.name]

    def __getitem__(self, name: str):
        """The array of field `name`, or the leaves of the observation fields `name.*` as a dict."""
        array = self.arrays.get(name)
        return array if array is not None else self.groups[name]

    def get(self, name: str) -> int:
        return int(self.header[self._header_index[name]])

    def set(self, **values: int) -> None:
        for name, value in values.items():
            self.header[self._header_index[name]] = value


# --- the message kinds of the hot path ------------------------------------------------------------

# Every header starts with the policy it belongs to: a record's and a weights message's policy
# (several policies train at once in multi-agent runs, core/policies.py). A request mixes rows of
# several policies; its rows say theirs.
STOP = 1  # flags bit: the run is over; the receiver finishes and exits
END = STOP  # flags bit of a parameter stream's last version: the stream closes after it
PREEMPTED = 2  # flags bit, with STOP: the run was stopped by a signal and will resume from its checkpoint
OUTPUT_FAILED = 4  # flags bit, with STOP: the learner root could not write its outputs (a full disk)
VALUES_ONLY = 8  # request flags bit: only the values are wanted (sync mode's bootstrap after step T):
#                  a recurrent policy's hidden state does not advance, the same observations come again
KEEP_ENV_STATE = 16  # weights and reply flags bit (sync, run.deterministic): a checkpoint follows the next
#                      update, so env ranks write their state at the next version's start (io/env_states.py)
# The header words of every sample-stream record (a fragment; DQN's transitions and sequences add
# `count`, their rows filled): the trainers read and count them alike.
RECORD_HEADER = ("policy_id", "env_rank", "version", "index", "frames", "flags", "rollout_us", "wait_us",
                 "credit_wait_us")
EPISODE_STATS = ("episodes", "return_sum", "return_sqsum", "return_min", "return_max", "length_sum")


def obs_fields(name: str, lead: tuple, obs_shape, obs_dtype=None) -> list:
    """The message fields of observations `name` with leading axes `lead`: one field of `obs_shape`
    and `obs_dtype`, or (`obs_shape` an ObsLeaves) one per leaf of a structured observation."""
    if isinstance(obs_shape, ObsLeaves):
        return obs_shape.fields(name, lead)
    return [(name, obs_dtype, (*lead, *obs_shape))]


def request_spec(num_envs: int, obs_shape: tuple, obs_dtype, mask_actions: int = 0,
                 policies: bool = False, recurrent: bool = False) -> MessageSpec:
    """env -> inference: observations for one step (with `mask_actions`, each row's valid actions
    out of that many), then final observations of episodes that were truncated (their values
    bootstrap the return). final_obs is last so a send can stop after `n_final` rows. With
    `policies` (a run of several), the policy id of each row and of each final row: the server
    batches rows by it. With `recurrent` (model.core), which rows' observations begin an episode
    (the policy holder zeroes their hidden state first) and the row of each final observation
    (its value is taken from the state that row's episode ended in). The header's `row0` (the global
    index of the request's first row among all of the run's env rows) and `step` (the rows' action
    step since the run began) key the holder's random draws for these rows (core/seeds.py)."""
    mask = [("action_mask", np.uint8, (num_envs, mask_actions))] if mask_actions else []
    ids = [("policy", np.int16, (num_envs,)), ("final_policy", np.int16, (num_envs,))] if policies else []
    starts = [("starts", np.uint8, (num_envs,)), ("final_rows", np.int32, (num_envs,))] if recurrent else []
    return MessageSpec(
        header=("policy_id", "version", "n_final", "flags", "row0", "step"),
        fields=[*obs_fields("obs", (num_envs,), obs_shape, obs_dtype), *mask, *ids, *starts,
                *obs_fields("final_obs", (num_envs,), obs_shape, obs_dtype)])


def reply_spec(num_envs: int, action_shape: tuple, action_dtype, state_size: int = 0) -> MessageSpec:
    """inference -> env: one action, its log-probability and the state value per env. With a
    recurrent policy (`state_size` floats per row), the hidden state each row's action was taken
    from, as plain numbers: the actor keeps the one that starts its fragment."""
    return MessageSpec(
        header=("policy_id", "version", "flags"),
        fields=[("actions", action_dtype, (num_envs, *action_shape)),
                ("logp", np.float32, (num_envs,)),
                ("values", np.float32, (num_envs,)),
                ("final_values", np.float32, (num_envs,))]
        + ([("state", np.float32, (num_envs, state_size))] if state_size else []))


def action_reply_spec(num_envs: int, action_shape: tuple) -> MessageSpec:
    """inference -> env (SAC, TD3): the policy's action per env, squashed into [-1, 1]; the actor
    explores and rescales. `final_values` as the other replies have it (none are asked for)."""
    return MessageSpec(
        header=("policy_id", "version", "flags"),
        fields=[("actions", np.float32, (num_envs, *action_shape)),
                ("final_values", np.float32, (num_envs,))])


def q_reply_spec(num_envs: int, num_actions: int, state_size: int = 0) -> MessageSpec:
    """inference -> env (DQN): the Q-value of every action per env. The actor picks its actions
    (epsilon-greedy, per env) and computes its transitions' initial priorities from them, so it
    needs no torch. `final_values`: the max Q of final observations (sequence actors send those of
    truncated episodes; transition actors send none). With a recurrent Q-network (`state_size`),
    the hidden state each row's Q-values were computed from: sequences store the one they start at."""
    return MessageSpec(
        header=("policy_id", "version", "flags"),
        fields=[("q", np.float32, (num_envs, num_actions)),
                ("final_values", np.float32, (num_envs,))]
        + ([("state", np.float32, (num_envs, state_size))] if state_size else []))


# What a replay keeps of a record's rows: every field but these (core/messages.py's DQN records)
NOT_REPLAYED = ("priorities", "episode_stats")


def replay_fields(spec: MessageSpec) -> list[str]:
    """The fields of a DQN record (transitions or sequences) that its rows are stored with."""
    return [f.name for f in spec.fields if f.name not in NOT_REPLAYED]


def transition_spec(rows: int, obs_shape: tuple, obs_dtype, action_shape: tuple, action_dtype) -> MessageSpec:
    """env -> learner (DQN): `rows` n-step transitions, of which the first `count` are filled:
    s_t, a_t, the discounted n-step return G, the discount of its bootstrap (gamma^k, 0 after a
    terminal step), s_t+k, and the actor's initial priority |G + discount max_a Q(s_t+k, a) -
    Q(s_t, a_t)|. The header words after `flags` are those of a fragment (timings; `frames`: env
    steps since the last record), so trainers count both alike. `obs_shape` may be an ObsLeaves
    (Dict observations: a field per leaf of s and of s')."""
    k = rows
    return MessageSpec(
        header=(*RECORD_HEADER, "count"),
        fields=[*obs_fields("obs", (k,), obs_shape, obs_dtype),
                ("actions", action_dtype, (k, *action_shape)),
                ("returns", np.float32, (k,)),
                ("discounts", np.float32, (k,)),
                *obs_fields("next_obs", (k,), obs_shape, obs_dtype),
                ("priorities", np.float32, (k,)),
                ("episode_stats", np.float64, (len(EPISODE_STATS),))])


def sequence_spec(rows: int, length: int, obs_shape, obs_dtype, action_shape: tuple, action_dtype,
                  state_size: int) -> MessageSpec:
    """env -> learner (R2D2-style DQN): `rows` sequences of `length` (L) steps of one env each, of
    which the first `count` are filled: observations 0..L, actions, rewards, whether the episode
    ended at each step by termination or by a time limit (and then its final observation's max Q,
    from the state the episode ended in), the recurrent state before step 0, and the actor's
    initial priority (algos/sequences.py). The header is a transition record's."""
    k, L = rows, length
    return MessageSpec(
        header=(*RECORD_HEADER, "count"),
        fields=[*obs_fields("obs", (k, L + 1), obs_shape, obs_dtype),
                ("actions", action_dtype, (k, L, *action_shape)),
                ("rewards", np.float32, (k, L)),
                ("terminated", np.uint8, (k, L)),
                ("truncated", np.uint8, (k, L)),
                ("final_values", np.float32, (k, L)),
                ("state0", np.float32, (k, state_size)),
                ("priorities", np.float32, (k,)),
                ("episode_stats", np.float64, (len(EPISODE_STATS),))])


def team_spec(rows: int, length: int, agents: int, obs_shape, obs_dtype, action_shape: tuple, action_dtype,
              state_size: int) -> MessageSpec:
    """env -> learner (VDN, QMIX): `rows` episodes of a team of `agents`, each stored whole up to
    `length` (L) steps, of which the first `count` are filled: every agent's observations 0..L (the
    one after an episode's last step is its final observation, the one after step L-1 of a longer
    episode's chunk the next chunk's first), every agent's actions, the team's reward, whether the
    episode terminated at each step, which steps the episode filled (the rest is padding), every
    agent's recurrent state before step 0 (`state_size` floats each, side by side; none for a
    feed-forward network), and the actor's initial priority (-1: the shard's largest, since
    only the learner's mixer can value a team). The header is a transition record's."""
    k, L = rows, length
    state = [("state0", np.float32, (k, agents * state_size))] if state_size else []
    return MessageSpec(
        header=(*RECORD_HEADER, "count"),
        fields=[*obs_fields("obs", (k, L + 1, agents), obs_shape, obs_dtype),
                ("actions", action_dtype, (k, L, agents, *action_shape)),
                ("rewards", np.float32, (k, L)),
                ("terminated", np.uint8, (k, L)),
                ("filled", np.uint8, (k, L)),
                *state,
                ("priorities", np.float32, (k,)),
                ("episode_stats", np.float64, (len(EPISODE_STATS),))])


def fragment_spec(length: int, num_envs: int, obs_shape: tuple, obs_dtype,
                  action_shape: tuple, action_dtype, active: bool = False, mask_actions: int = 0,
                  selfplay_opponents: int = 0, state_size: int = 0) -> MessageSpec:
    """env -> learner: T steps x N envs (rows: with PettingZoo envs, one per agent) of experience
    plus what GAE needs to bootstrap. With `active`, a [T, N] mask of the rows whose agent acted
    (multi-agent: inactive rows are left out of the loss); with `mask_actions`, the valid actions
    each step's row had (the learner's log-probabilities use the same mask).
    `version` is the policy version of the fragment's first step (async: the oldest in it);
    `last_obs` are the observations after step T-1, for V-trace's bootstrap with the learner's
    own critic. A message with the STOP flag is an env rank's last (no data). `rollout_us` is the
    wall time the fragment took, `wait_us` the part of it in which no env group could step, and
    `credit_wait_us` the part in which the finished fragment waited for a credit (flow control).
    `return_moments` (count, mean, M2) of the discounted returns its envs saw, for the trainers'
    reward scale (env.normalize_reward; zeros without it). With `selfplay_opponents` (algo.selfplay's
    pool ages and anchors), the games the learning seat finished against each: wins, draws, losses. With
    `state_size` (a recurrent policy), each row's hidden state before step 0, and `starts`, the rows
    whose state the policy holder zeroed before each step (an episode began): the trainer replays
    the fragment as a sequence from the first, zeroing where the second says."""
    t, n = length, num_envs
    return MessageSpec(
        header=RECORD_HEADER,
        fields=[*obs_fields("obs", (t, n), obs_shape, obs_dtype),
                ("actions", action_dtype, (t, n, *action_shape)),
                ("logp", np.float32, (t, n)),
                ("values", np.float32, (t, n)),
                ("rewards", np.float32, (t, n)),
                ("dones", np.uint8, (t, n)),
                ("trunc_values", np.float32, (t, n)),
                ("last_values", np.float32, (n,)),
                *obs_fields("last_obs", (n,), obs_shape, obs_dtype),
                ("episode_stats", np.float64, (len(EPISODE_STATS),)),
                ("return_moments", np.float64, (3,))] + ([("active", np.uint8, (t, n))] if active else [])
        + ([("action_mask", np.uint8, (t, n, mask_actions))] if mask_actions else [])
        + ([("selfplay", np.float64, (selfplay_opponents, 3))] if selfplay_opponents else [])
        + ([("init_state", np.float32, (n, state_size)), ("starts", np.uint8, (t, n))] if state_size else []))


def weights_spec(num_params: int, league: bool = False) -> MessageSpec:
    """learner root -> policy holders: the flat parameter vector of one policy version. A league
    member's (core/league.py) also carries one of its slots: which, the league snapshot it holds
    (-1: none yet), and that snapshot's weights (workers/league.py)."""
    if not league:
        return MessageSpec(header=("policy_id", "version", "flags"), fields=[("params", np.float32, (num_params,))])
    return MessageSpec(header=("policy_id", "version", "flags", "slot", "slot_id"),
                       fields=[("params", np.float32, (num_params,)), ("slot_params", np.float32, (num_params,))])


# Fragment fields whose second axis (or, for these two, first) runs over the rows: a policy's
# record takes its agents' columns of them (core/policies.py). The rest are per record.
ROW_FIELDS = ("last_values", "last_obs", "init_state")  # [N, ...] fields (and the leaves last_obs.*)
PER_RECORD_FIELDS = ("episode_stats", "return_moments", "selfplay")


def take_rows(whole: Message, part: Message, rows: np.ndarray) -> None:
    """Copy `rows` of a fragment of every row into `part`, a fragment of those rows only (the
    record of one policy); per-record fields are copied whole, the header is left to the caller."""
    for f in part.spec.fields:
        if f.name.split(".")[0] in ROW_FIELDS:
            part[f.name][...] = whole[f.name][rows]
        elif f.name in PER_RECORD_FIELDS:
            part[f.name][...] = whole[f.name]
        else:
            part[f.name][...] = whole[f.name][:, rows]
