"""The sizes a config and a layout imply, worked out without running anything.

`Sizes`: what the workers are built with (batches, sample slots, fragments per policy version,
replay shards, env groups), derived once from the config and the layout by `Sizes.of`, the one
home of each of those rules and of its config error. Launch derives it once per process and the
wiring hands it to every worker; `hpcrl plan` and `hpcrl tune` read the same.

From those, the estimates: the memory each role's buffers, batch and model take (`memory`, and
`memory_problem`, which turns it into a config error before a run allocates anything), the bytes
each role sends (`traffic`), what crosses nodes (`crossing`), and the layout problems worth a
warning. `hpcrl plan` prints them; `hpcrl run` checks and warns with the same numbers. `spaces`
arguments are `hpcrl.envs.EnvSpaces` (not imported: core stays below envs).

(Over 400 lines: the size rules and the estimates built on them are one piece of arithmetic,
read by plan, tune and launch alike.)
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from hpcrl.core.config import DEFAULT_MAX_ENV_RANKS, Config, ConfigError
from hpcrl.core.dataflow import algorithm_of, inference_messages
from hpcrl.core.config_sac import replay_settings
from hpcrl.core.layout import INLINE, Layout
from hpcrl.core.league import largest_ring
from hpcrl.core.messages import MessageSpec, replay_fields, weights_spec

# Fragment buffers per env rank (one fills while the previous is in flight), and so the most
# sample-stream credits it holds at once
FRAGMENT_BUFFERS = 2


@dataclass(frozen=True)
class ReplayShard:
    """DQN: one learner's replay shard, the config's totals shared by the learners."""

    capacity: int
    warmup: int
    batch: int  # transitions (sequences, with model.core) per gradient step


@dataclass(frozen=True)
class LearnerSizes:
    """What one learner trains on; all of it follows from its fan-in (the env ranks it trains on)."""

    fan_in: int
    batch_fragments: int  # fragments in one batch (FragmentQueue)
    sample_slots: int  # its sample stream's slots: roles.learner.sample_slots, or the default
    # its share of its policy's batch times the learners of the policy: its gradient's weight in
    # the average, so that the average is the mean over all samples (1.0 when every learner's batch
    # is as large as the others', as in async mode with batch_frames)
    batch_share: float
    replay: ReplayShard | None  # DQN: its replay shard


@dataclass(frozen=True)
class Sizes:
    """The sizes a config and a layout imply, derived once (`Sizes.of`, where every rule and its
    ConfigError lives); launch hands them to every worker, and plan, tune and the memory and traffic
    estimates read the same."""

    fragment_frames: int  # frames per fragment: algo.rollout_length x env.num_envs
    env_groups: int  # env groups per env rank
    # sync mode: fragments every env rank collects with one policy version (1 in async mode, where
    # env ranks never wait for a version)
    fragments_per_version: int
    update_frames: int  # frames per update, all learners of a policy together (a frame is an env step)
    learners: Mapping[int, LearnerSizes]  # by learner world rank

    @classmethod
    def of(cls, cfg: Config, layout: Layout) -> Sizes:
        """A ConfigError when algo.batch_frames (or DQN's batch_size) does not fit the layout, or
        roles.learner.sample_slots cannot hold a batch."""
        F = cfg.algo.rollout_length * cfg.env.num_envs
        replay = _replay_shard(cfg, layout) if algorithm_of(cfg).replay else None
        k = _fragments_per_version(cfg, layout, F)
        update = cfg.algo.batch_frames if cfg.algo.batch_frames is not None else len(layout.envs) * F
        fans = layout.fan_in("learner")
        by_fan: dict[int, LearnerSizes] = {}
        for fan in sorted(set(fans.tolist()), reverse=True):  # the busiest first: its error is the one told
            batch = _batch_fragments(cfg, layout, F, k, fan)
            by_fan[fan] = LearnerSizes(fan, batch, _sample_slots(cfg, layout, k, batch, fan),
                                       batch * layout.learners_per_policy / (update // F), replay)
        return cls(F, 1 if layout.inline_inference else cfg.env.groups, k, update,
                   {int(rank): by_fan[int(fan)] for rank, fan in zip(layout.learners, fans)})

    def learner(self, rank: int) -> LearnerSizes:
        return self.learners[rank]

    @property
    def busiest(self) -> LearnerSizes:
        """The learner with the largest fan-in: the most slots and (sync) the largest batch."""
        return max(self.learners.values(), key=lambda s: s.fan_in)


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'s' if n != 1 else ''}"


def _nearest(value: int, step: int) -> str:
    """The multiples of `step` nearest `value` (which is not one), for an error message."""
    low = value // step * step
    return f"nearest: {low:,} or {low + step:,}" if low else f"smallest: {step:,}"


def _replay_shard(cfg: Config, layout: Layout) -> ReplayShard:
    """DQN, SAC, TD3: the replay shard of one learner; a ConfigError when the batch size
    (algo.dqn.batch_size, algo.sac.batch_size) is not the same whole number for every learner."""
    (d, where), r, L = replay_settings(cfg.algo), cfg.algo.replay, len(layout.learners)
    if d.batch_size % L:
        low = d.batch_size // L * L
        rows = f"{d.batch_size} transitions (sequences, with model.core) per gradient step"
        raise ConfigError(f"{where}.batch_size: {rows} are not the same number for each of the "
                          f"{_count(L, 'learner')}; use a multiple of {L} ({_nearest(d.batch_size, L)})" if low else
                          f"{where}.batch_size: {rows} cannot be shared by {_count(L, 'learner')}; use at least "
                          f"{L} (a multiple of {L})")
    return ReplayShard(-(-r.capacity // L), -(-r.warmup // L), d.batch_size // L)


def _fragments_per_version(cfg: Config, layout: Layout, F: int) -> int:
    """Sync mode: algo.batch_frames / (env ranks x frames per fragment F); 1 when batch_frames is
    null, in async mode and for DQN. The rule that a batch fits the layout: a ConfigError when
    batch_frames is not a whole number of fragments per env rank (sync) or per learner (async)."""
    a, E = cfg.algo, len(layout.envs)
    if algorithm_of(cfg).replay or a.batch_frames is None:
        return 1
    if a.mode == "async":
        L = layout.learners_per_policy
        if a.batch_frames % (L * F):
            raise ConfigError(
                f"algo.batch_frames: {a.batch_frames:,} frames are not a whole number of fragments per learner: in "
                f"async mode each learner's batch is batch_frames / {_count(L, 'learner')}, in fragments of {F:,} "
                f"frames (algo.rollout_length {a.rollout_length} x env.num_envs {cfg.env.num_envs}), so "
                f"batch_frames must be a multiple of {L} x {F:,} = {L * F:,} ({_nearest(a.batch_frames, L * F)})")
        return 1
    if a.batch_frames % (E * F):
        raise ConfigError(
            f"algo.batch_frames: {a.batch_frames:,} frames are not a whole number of fragments per env rank: in "
            f"sync mode the batch is the same whole number of fragments of {F:,} frames (algo.rollout_length "
            f"{a.rollout_length} x env.num_envs {cfg.env.num_envs}) from each env rank, and this job has "
            f"{_count(E, 'env rank')}, so batch_frames must be a multiple of {E} x {F:,} = {E * F:,} "
            f"({_nearest(a.batch_frames, E * F)}; or use an env-rank count that divides it)")
    return a.batch_frames // (E * F)


def _batch_fragments(cfg: Config, layout: Layout, F: int, k: int, fan_in: int) -> int:
    """Fragments in one batch of a learner that trains on `fan_in` env ranks: one per env rank
    (batch_frames null), algo.batch_frames / learners in async mode (the same for every learner),
    or k per env rank in sync mode."""
    if cfg.algo.batch_frames is not None and cfg.algo.mode == "async":
        return cfg.algo.batch_frames // (layout.learners_per_policy * F)
    return k * fan_in


def _sample_slots(cfg: Config, layout: Layout, k: int, batch: int, fan_in: int) -> int:
    """Fragment slots of a learner with a batch of `batch` fragments from `fan_in` env ranks
    (roles.learner.sample_slots); a ConfigError if they cannot hold one batch.

    Sync mode with k > FRAGMENT_BUFFERS fragments per env rank and version needs more: an env rank
    that has sent its k may still hold up to FRAGMENT_BUFFERS credits, and their slots stay
    reserved until the batch is trained, so a slow env rank could be left without a credit for
    its last fragments (with k <= FRAGMENT_BUFFERS every env rank holds credits for its whole
    share when a version starts). The default adds a fragment per env rank to a batch, so the
    next batch arrives while one trains (two per env rank when batch_frames is null)."""
    minimum = batch + (FRAGMENT_BUFFERS * (fan_in - 1) if cfg.algo.mode == "sync" and k > FRAGMENT_BUFFERS else 0)
    slots = cfg.roles.learner.sample_slots
    if slots is None and algorithm_of(cfg).replay:
        # a replay takes records in as they come, unless it holds them back to keep its replay
        # ratio: then every slot more is a record that waits and grows older (policy lag)
        return fan_in
    default = max(2 * fan_in, batch + fan_in, minimum)
    if cfg.algo.mode == "async":
        # env ranks that stall (a stopped or throttled node) keep the credits they hold, and their
        # slots with them; async mode trains on whoever delivers, so one env rank alone must still
        # be able to fill a batch (measured: without this, APPO stopped while a node was frozen)
        default = max(default, batch + FRAGMENT_BUFFERS * (fan_in - 1))
    if slots is None:
        return default
    if slots >= minimum:
        return slots
    if cfg.algo.batch_frames is None:
        raise ConfigError(f"roles.learner.sample_slots: {slots} slots cannot hold a batch of one fragment from "
                          f"each of the {fan_in} env ranks a learner trains on; use at least {fan_in} (or more "
                          f"learners)")
    why = (f"a batch of {batch} fragments (algo.batch_frames {cfg.algo.batch_frames:,} over "
           + (f"{_count(layout.learners_per_policy, 'learner')})" if cfg.algo.mode == "async" else
              f"{_count(len(layout.envs), 'env rank')}: {k} from each env rank a learner trains on, {fan_in} here)"))
    if minimum > batch:
        why += (f" plus the {FRAGMENT_BUFFERS} credits each of the other {fan_in - 1} env ranks may still hold once "
                f"it has sent its {k} fragments of a policy version")
    raise ConfigError(f"roles.learner.sample_slots: {slots} slots cannot hold {why}; use at least {minimum} (or "
                      f"leave it unset for the default, {default})")


MODEL_COPIES = {"learner": 5, "inference": 2, "env": 2}  # params x: weights, grads, Adam's two moments, message
DEFAULT_MEMORY_PER_RANK = 4 * 2**30  # what a core of a typical HPC node has
MEMORY_LIMIT_UNKNOWN_NODE = 64 * 2**30  # run.memory_limit_gib's default where a node's memory cannot be read


@dataclass
class Memory:
    """Bytes the busiest rank of each role holds for hpcrl's own buffers, batch and model (the
    Python, torch and env processes themselves come on top: about 50 MiB for a torch-free env
    rank, 250 MiB for a rank with torch)."""

    env: int
    inference: int
    learner: int

    def of(self, role: str) -> int:
        return getattr(self, role)


def memory(cfg: Config, layout: Layout, sizes: Sizes, spaces, num_params: int, population=None) -> Memory:
    """`population`: the population section of a league (core/league.py), whose member `cfg` is:
    its weights messages carry a slot besides the policy, and its learner root holds snapshots."""
    G = sizes.env_groups
    req, rep = (m.nbytes for m in inference_messages(cfg, spaces, G))
    record = algorithm_of(cfg).record(cfg, spaces)
    frag = record.nbytes
    league = population is not None and population.league.members > 0
    weights = weights_spec(num_params, league).nbytes
    model = 4 * num_params
    learner = sizes.busiest
    inference_fan = int(layout.fan_in("inference").max()) if len(layout.inference) else 0
    inline = layout.inline_inference
    # a policy holder (an inference rank, or an env rank with inline inference) holds every policy
    # (each counted at the largest's size) and, with a self-play pool, that many frozen copies more
    holder = layout.policies * weights + cfg.algo.selfplay.pool * model
    env = G * (req + rep) + FRAGMENT_BUFFERS * frag + (
        MODEL_COPIES["env"] * layout.policies * model + holder if inline else 0)
    # inference: a request and a reply buffer per (env rank, group), the batch arrays, the policies
    inference = inference_fan * G * (2 * req + 2 * rep) + MODEL_COPIES["inference"] * layout.policies * model + holder
    # learner: the sample slots, the batch assembled from them (a copy of its fragments), the model;
    # DQN: the replay shard and its sum-tree instead of the batch, and a target network
    if algorithm_of(cfg).replay:  # and a target network (SAC's, TD3's: a whole copy)
        data = replay_bytes(learner.replay, record) + model
    else:
        data = learner.batch_fragments * frag
    if league:  # the learner root's own snapshots and its slots (workers/league.py)
        lg = population.league
        data += (largest_ring(lg, population.ready_frames) + cfg.algo.selfplay.pool) * model
    return Memory(env=env, inference=inference if inference_fan else 0,
                  learner=learner.sample_slots * frag + data + MODEL_COPIES["learner"] * model + weights)


def memory_limit(cfg: Config) -> tuple[int, str]:
    """Bytes one rank may need for hpcrl's buffers, batch and model, and where that number comes from:
    run.memory_limit_gib, or the physical memory of this node (rank 0's, which checks the config)."""
    if cfg.run.memory_limit_gib is not None:
        return int(cfg.run.memory_limit_gib * 2**30), "run.memory_limit_gib"
    try:
        node = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return node, "this node's memory, run.memory_limit_gib: null"
    except (ValueError, OSError, AttributeError):  # no sysconf, or it does not know these names
        return MEMORY_LIMIT_UNKNOWN_NODE, "run.memory_limit_gib: null, where a node's memory is unknown"


def memory_problem(cfg: Config, layout: Layout, sizes: Sizes, spaces, n_params: int) -> str | None:
    """What is wrong when the busiest rank of some role would need more memory than `memory_limit`
    for hpcrl's buffers, batch and model (as `hpcrl plan` estimates them; `n_params` as
    `hpcrl.core.network_shapes.policy_params` counts them, without torch), naming the config key that
    drives it; None when every rank fits. A run
    checks this before it builds its first model, so a 10**9-wide layer or a 10**9-frame fragment
    is a config error, not a MemoryError after the run directory was written."""
    mem = memory(cfg, layout, sizes, spaces, n_params)
    # serial mode: rank 0 is the learner and the env rank at once
    need = {"learner": mem.learner + mem.env} if layout.serial else {r: mem.of(r) for r in MODEL_COPIES}
    role = max(need, key=need.get)
    limit, source = memory_limit(cfg)
    if need[role] <= limit:
        return None
    model = MODEL_COPIES[role] * 4 * n_params
    pool = cfg.algo.selfplay.pool * 4 * n_params if role in ("inference", "env") or layout.serial else 0
    if pool >= need[role] / 2:
        key, advice = "algo.selfplay.pool", "keep fewer past versions, or lower model.hidden_sizes"
    elif 2 * model >= need[role]:
        key = "model.hidden_sizes" + (" and model.core_size" if cfg.model.core != "none" else "")
        advice = f"lower {key}"
    else:
        key, advice = _data_key(cfg, role), _lower_memory(cfg, role)
    who = "rank 0 (learner and env rank at once, serial mode)" if layout.serial else f"each {role} rank"
    return (f"{key}: {who} would need about {format_bytes(need[role])} for its buffers, batch and model "
            f"({n_params:,} parameters), more than the {format_bytes(limit)} one rank may use ({source}): {advice}")


def _data_key(cfg: Config, role: str) -> str:
    """The config key whose value sizes a role's buffers most."""
    if role == "learner" and algorithm_of(cfg).replay:
        return "algo.replay.capacity"
    if role == "learner" and cfg.algo.batch_frames is not None:
        return "algo.batch_frames"
    return "env.num_envs" if role == "inference" else "env.num_envs x algo.rollout_length"


def _lower_memory(cfg: Config, role: str) -> str:
    """What shrinks the buffers and batch of one rank of `role`."""
    if role == "learner":
        return ("add learners or lower algo.replay.capacity" if algorithm_of(cfg).replay else
                "add learners or lower roles.learner.sample_slots, env.num_envs or algo.rollout_length"
                if cfg.algo.batch_frames is None else
                "add learners or lower roles.learner.sample_slots or algo.batch_frames")
    return "add inference ranks or lower env.num_envs" if role == "inference" else \
        "lower env.num_envs or algo.rollout_length"


def replay_bytes(shard: ReplayShard, record: MessageSpec) -> int:
    """One DQN learner's replay shard: its transitions (or sequences), their raw priorities, the sum-tree (float64
    over the next power of two of leaves) and a sampled batch."""
    capacity, batch = shard.capacity, shard.batch
    row = sum(record.field(name).nbytes // record.field(name).shape[0] for name in replay_fields(record))
    leaves = 1 << max(capacity - 1, 0).bit_length()
    return capacity * (row + 8) + 2 * leaves * 8 + batch * row


@dataclass
class Traffic:
    """Bytes per second sent by one rank of each kind, at `steps_per_second` vector steps per env rank."""

    env_requests: float
    env_fragments: float
    inference_replies: float  # per inference rank at its largest fan-in
    learner_fragments_in: float  # received by the learner with the largest fan-in
    weights_per_update: int
    updates_per_second: float
    allreduce_per_second: float  # gradient bytes each learner reduces per second


def traffic(cfg: Config, layout: Layout, sizes: Sizes, spaces, num_params: int, steps_per_second: float) -> Traffic:
    T, N = cfg.algo.rollout_length, cfg.env.num_envs
    G = sizes.env_groups
    req, rep = inference_messages(cfg, spaces, G)
    frag = algorithm_of(cfg).record(cfg, spaces)
    # per group and step one request (G per env step), plus one per rollout for bootstrap values (PPO)
    replay = algorithm_of(cfg).replay  # one request per step, updates by the replay ratio
    requests_per_s = G * steps_per_second * (1 if replay else (T + 1) / T)
    fragments_per_s = steps_per_second / T
    remote = not layout.inline_inference
    inf_fan = int(layout.fan_in("inference").max()) if remote else 0
    learner_fan = int(layout.fan_in("learner").max())
    frames_per_s = fragments_per_s * len(layout.envs) * T * N
    if replay:  # replay_ratio samples per frame, in updates of gradient_steps x batch_size (null: as fast as they can)
        d, _ = replay_settings(cfg.algo)
        updates_per_s = frames_per_s * (cfg.algo.replay.replay_ratio or 0.0) / (d.gradient_steps * d.batch_size)
        steps_per_update = d.gradient_steps
    else:  # one update per batch_frames frames (a fragment per env rank by default), if training keeps up
        updates_per_s = frames_per_s / sizes.update_frames
        steps_per_update = cfg.algo.epochs * cfg.algo.num_minibatches
    return Traffic(
        env_requests=requests_per_s * req.group_offset("final_obs") if remote else 0.0,
        env_fragments=fragments_per_s * frag.nbytes,
        inference_replies=inf_fan * requests_per_s * rep.nbytes,
        learner_fragments_in=learner_fan * fragments_per_s * frag.nbytes,
        weights_per_update=4 * num_params,
        updates_per_second=updates_per_s,
        allreduce_per_second=(updates_per_s * steps_per_update * 4 * num_params
                              if len(layout.learners) > 1 else 0.0))


@dataclass
class Crossing:
    """What crosses nodes in a layout, per event: the prediction that a run's measured counts
    (metrics.h5's crossed_nodes attributes, `hpcrl.runtime.traffic`) are checked against."""

    weights_copies: int  # messages per weights version: one to each node holding a policy copy, but the root's
    weights_bytes: int  # bytes of one of them
    remote_inference: int  # env ranks whose policy server is on another node: each step's request and reply cross
    remote_learner: int  # env ranks (per policy) whose learner is on another node: each fragment and credit crosses


def crossing(layout: Layout, num_params: int) -> Crossing:
    node = layout.node_of_rank
    root = layout.learner_root
    holders = {int(node[r]) for r in layout.weight_subscribers()}
    served = layout.env_inference != INLINE
    remote_inference = int(np.sum(node[layout.env_inference[served]] != node[layout.envs[served]]))
    remote_learner = int(np.sum(node[layout.env_learners] != node[layout.envs][None, :]))
    return Crossing(len(holders - {int(node[root])}), weights_spec(num_params).nbytes, remote_inference,
                    remote_learner)


def warnings(cfg: Config, layout: Layout, mem: Memory | None = None,
             memory_per_rank: int = DEFAULT_MEMORY_PER_RANK) -> list[str]:
    """Layout problems worth fixing before a long job: fan-in and memory limits, imbalance,
    cross-node traffic."""
    out = []
    for role in ("learner", "inference", "env") if mem is not None else ():
        if mem.of(role) > memory_per_rank:
            out.append(f"each {role} rank needs about {format_bytes(mem.of(role))} for its buffers, batch and model, more "
                       f"than the {format_bytes(memory_per_rank)} per rank assumed (--memory-per-rank-gib): "
                       + _lower_memory(cfg, role))
    for role in ("inference", "learner"):
        fan = layout.fan_in(role)
        if len(fan) == 0:
            continue
        limit = getattr(cfg.roles, role).max_env_ranks
        limit = DEFAULT_MAX_ENV_RANKS if limit is None else limit
        servers = layout.learners if role == "learner" else layout.inference
        if limit and fan.max() > limit:
            worst = int(servers[int(np.argmax(fan))])
            out.append(f"{int((fan > limit).sum())} {role} ranks serve more than roles.{role}.max_env_ranks = "
                       f"{limit} env ranks (rank {worst} serves {int(fan.max())}); add {role} ranks")
        # learners: imbalance stalls every sync update; inference: only a marked one matters
        uneven = (fan.max() > 1.05 * fan.min() if role == "learner"
                  else fan.max() > max(1.2 * fan.mean(), fan.min() + 1))
        if uneven:
            slow = int(servers[int(np.argmax(fan))])
            what = ("its env ranks wait longer for actions" if role != "learner" else
                    "every sync update waits for it" if cfg.algo.mode == "sync" else
                    "the learners average gradients in lockstep, so every update waits for its batch")
            out.append(f"{role} fan-in is uneven ({int(fan.min())} to {int(fan.max())} env ranks): {role} rank "
                       f"{slow} will be the bottleneck, {what}; make the env rank count a multiple of the "
                       f"{role} count")
    if not layout.inline_inference:
        remote = layout.node_of_rank[layout.envs] != layout.node_of_rank[layout.env_inference]
        if remote.any():
            out.append(f"{int(remote.sum())} env ranks use an inference rank on another node (their nodes have "
                       f"none): observations cross the network every step; use inference per_node")
    return out


def format_bytes(x: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if x >= size:
            return f"{x / size:.1f} {unit}"
    return f"{x:.0f} B"
