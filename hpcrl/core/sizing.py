"""The sizes a config and a layout imply, worked out without running anything: the memory each
role's buffers, batch and model take (`memory`, and `memory_problem`, which turns it into a config
error before a run allocates anything), the bytes each role sends (`traffic`), what crosses nodes
(`crossing`), and the layout problems worth a warning. `hpcrl plan` prints them; `hpcrl run`
checks and warns with the same numbers. `spaces` arguments are `hpcrl.envs.EnvSpaces` (not
imported: core stays below envs)."""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from hpcrl.core.config import DEFAULT_MAX_ENV_RANKS, Config
from hpcrl.core.dataflow import ALGORITHMS, inference_messages
from hpcrl.core.layout import (FRAGMENT_BUFFERS, INLINE, Layout, batch_fragments, env_groups, plan_layout,
                               replay_shard, sample_slots, update_frames)
from hpcrl.core.messages import MessageSpec, replay_fields, weights_spec
from hpcrl.core.policies import num_policies

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


def memory(cfg: Config, layout: Layout, spaces, num_params: int) -> Memory:
    G = env_groups(cfg, layout)
    req, rep = (m.nbytes for m in inference_messages(cfg, spaces, G))
    frag = ALGORITHMS[cfg.algo.name].record(cfg, spaces).nbytes
    weights = weights_spec(num_params).nbytes
    model = 4 * num_params
    learner_fan = int(layout.fan_in("learner").max()) if len(layout.learners) else 0
    inference_fan = int(layout.fan_in("inference").max()) if len(layout.inference) else 0
    inline = layout.inline_inference
    env = G * (req + rep) + FRAGMENT_BUFFERS * frag + (MODEL_COPIES["env"] * model + weights if inline else 0)
    # inference: a request and a reply buffer per (env rank, group), the batch arrays, the policy
    inference = inference_fan * G * (2 * req + 2 * rep) + MODEL_COPIES["inference"] * model + weights
    # learner: the sample slots, the batch assembled from them (a copy of its fragments), the model;
    # DQN: the replay shard and its sum-tree instead of the batch, and a target network
    if cfg.algo.name == "dqn":
        data = replayformat_bytes(cfg, layout, ALGORITHMS["dqn"].record(cfg, spaces)) + model
    else:
        data = batch_fragments(cfg, layout, learner_fan) * frag
    learner = (sample_slots(cfg, layout, learner_fan) * frag + data + MODEL_COPIES["learner"] * model
               + weights) if learner_fan else 0
    return Memory(env=env, inference=inference if inference_fan else 0, learner=learner)


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


def memory_problem(cfg: Config, world_size: int, spaces, n_params: int) -> str | None:
    """What is wrong when the busiest rank of some role would need more memory than `memory_limit`
    for hpcrl's buffers, batch and model (as `hpcrl plan` estimates them; `n_params` as
    `hpcrl.models.policy_params` counts them, with nothing allocated), naming the config key that
    drives it; None when every rank fits. A run
    checks this before it builds its first model, so a 10**9-wide layer or a 10**9-frame fragment
    is a config error, not a MemoryError after the run directory was written."""
    layout = plan_layout(cfg.roles, world_size, policies=num_policies(cfg.policies))
    mem = memory(cfg, layout, spaces, n_params)
    # serial mode: rank 0 is the learner and the env rank at once
    need = {"learner": mem.learner + mem.env} if layout.serial else {r: mem.of(r) for r in MODEL_COPIES}
    role = max(need, key=need.get)
    limit, source = memory_limit(cfg)
    if need[role] <= limit:
        return None
    model = MODEL_COPIES[role] * 4 * n_params
    if 2 * model >= need[role]:
        key = "model.hidden_sizes" + (" and model.core_size" if cfg.model.core != "none" else "")
        advice = f"lower {key}"
    else:
        key, advice = _data_key(cfg, role), _lower_memory(cfg, role)
    who = "rank 0 (learner and env rank at once, serial mode)" if layout.serial else f"each {role} rank"
    return (f"{key}: {who} would need about {format_bytes(need[role])} for its buffers, batch and model "
            f"({n_params:,} parameters), more than the {format_bytes(limit)} one rank may use ({source}): {advice}")


def _data_key(cfg: Config, role: str) -> str:
    """The config key whose value sizes a role's buffers most."""
    if role == "learner" and cfg.algo.name == "dqn":
        return "algo.replay.capacity"
    if role == "learner" and cfg.algo.batch_frames is not None:
        return "algo.batch_frames"
    return "env.num_envs" if role == "inference" else "env.num_envs x algo.rollout_length"


def _lower_memory(cfg: Config, role: str) -> str:
    """What shrinks the buffers and batch of one rank of `role`."""
    if role == "learner":
        return ("add learners or lower algo.replay.capacity" if cfg.algo.name == "dqn" else
                "add learners or lower roles.learner.sample_slots, env.num_envs or algo.rollout_length"
                if cfg.algo.batch_frames is None else
                "add learners or lower roles.learner.sample_slots or algo.batch_frames")
    return "add inference ranks or lower env.num_envs" if role == "inference" else \
        "lower env.num_envs or algo.rollout_length"


def replayformat_bytes(cfg: Config, layout: Layout, record: MessageSpec) -> int:
    """One DQN learner's replay shard: its transitions (or sequences), their raw priorities, the sum-tree (float64
    over the next power of two of leaves) and a sampled batch."""
    capacity, _, batch = replay_shard(cfg, layout)
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


def traffic(cfg: Config, layout: Layout, spaces, num_params: int, steps_per_second: float) -> Traffic:
    T, N = cfg.algo.rollout_length, cfg.env.num_envs
    G = env_groups(cfg, layout)
    req, rep = inference_messages(cfg, spaces, G)
    frag = ALGORITHMS[cfg.algo.name].record(cfg, spaces)
    # per group and step one request (G per env step), plus one per rollout for bootstrap values (PPO)
    dqn = cfg.algo.name == "dqn"
    requests_per_s = G * steps_per_second * (1 if dqn else (T + 1) / T)
    fragments_per_s = steps_per_second / T
    remote = not layout.inline_inference
    inf_fan = int(layout.fan_in("inference").max()) if remote else 0
    learner_fan = int(layout.fan_in("learner").max())
    frames_per_s = fragments_per_s * len(layout.envs) * T * N
    if dqn:  # replay_ratio samples per frame, in updates of gradient_steps x batch_size (null: as fast as they can)
        d = cfg.algo.dqn
        updates_per_s = frames_per_s * (cfg.algo.replay.replay_ratio or 0.0) / (d.gradient_steps * d.batch_size)
        steps_per_update = d.gradient_steps
    else:  # one update per batch_frames frames (a fragment per env rank by default), if training keeps up
        updates_per_s = frames_per_s / update_frames(cfg, layout)
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
