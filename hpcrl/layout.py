"""Who does what: turn the rank-role table and a world size into a plan for every rank.

Pure numpy (no MPI), so it can be tested with simulated node maps and plans 100,000 ranks fast.
Learners take the lowest ranks (the learner root is world rank 0, which prints progress), then
inference ranks, then env ranks. Each env rank talks to exactly one inference rank (preferably
on its own node) and one learner; fan-in is balanced.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from hpcrl.config import REST, ROLE_NAMES, ConfigError, RolesConfig

INLINE = -1  # env_inference entry for an env rank that runs its policy itself


def resolve_role_counts(roles: RolesConfig, world_size: int) -> dict[str, int]:
    """Role -> number of ranks for this world size; a ConfigError says which sizes would fit."""
    fixed = {r: getattr(roles, r).ranks for r in ROLE_NAMES if getattr(roles, r).ranks != REST}
    rest = [r for r in ROLE_NAMES if getattr(roles, r).ranks == REST]
    needed = sum(fixed.values())
    table = " + ".join(f"{r} {getattr(roles, r).ranks}" for r in ROLE_NAMES)
    if rest:
        left = world_size - needed
        minimum = needed + (1 if rest[0] in ("env", "learner") else 0)
        if left < 0 or (left == 0 and rest[0] in ("env", "learner")):
            raise ConfigError(f"roles ({table}) need a world size of at least {minimum}, "
                              f"but the job has {world_size} ranks; run with mpirun -n {minimum} or more")
        return {**fixed, rest[0]: left}
    if needed != world_size:
        raise ConfigError(f"roles ({table}) need a world size of exactly {needed}, but the job has "
                          f"{world_size} ranks; run with mpirun -n {needed}, or set one role's ranks to "
                          f"'rest' to fill any size")
    return dict(fixed)


@dataclass(frozen=True)
class Layout:
    """The whole job's plan. Arrays are indexed by role index; entries are world ranks."""

    world_size: int
    learners: np.ndarray
    inference: np.ndarray
    envs: np.ndarray
    env_inference: np.ndarray  # per env index: world rank of its inference rank, or INLINE
    env_learner: np.ndarray  # per env index: world rank of the learner that trains on its fragments

    @property
    def serial(self) -> bool:
        """World size 1: rank 0 is learner and env at once, with inline inference."""
        return self.world_size == 1

    @property
    def inline_inference(self) -> bool:
        return len(self.inference) == 0

    def roles_of(self, rank: int) -> tuple[str, ...]:
        roles = []
        for name, ranks in (("learner", self.learners), ("inference", self.inference), ("env", self.envs)):
            if rank in _members(ranks):
                roles.append(name)
        return tuple(roles)

    def index_in(self, role: str, rank: int) -> int:
        ranks = {"learner": self.learners, "inference": self.inference, "env": self.envs}[role]
        return int(np.flatnonzero(ranks == rank)[0])

    def envs_of_inference(self, rank: int) -> list[int]:
        return [int(r) for r in self.envs[self.env_inference == rank]]

    def envs_of_learner(self, rank: int) -> list[int]:
        return [int(r) for r in self.envs[self.env_learner == rank]]

    def weight_subscribers(self) -> list[int]:
        """Ranks that hold a policy copy fed by the learner root: inference ranks, else env ranks."""
        ranks = self.envs if self.inline_inference else self.inference
        return [int(r) for r in ranks if r != self.learners[0]]


def _members(ranks: np.ndarray) -> set[int]:
    return set(int(r) for r in ranks)


def _route_to_inference(envs: np.ndarray, inference: np.ndarray, node_of_rank: np.ndarray) -> np.ndarray:
    """Each env rank -> one inference rank, same node first, least-loaded otherwise."""
    out = np.full(len(envs), INLINE, dtype=np.int64)
    if len(inference) == 0:
        return out
    by_node: dict[int, list[int]] = {}
    for inf in inference:
        by_node.setdefault(int(node_of_rank[inf]), []).append(int(inf))
    load = {int(inf): 0 for inf in inference}
    next_on_node = {node: 0 for node in by_node}
    orphans = []
    for i, env in enumerate(envs):
        node = int(node_of_rank[env])
        local = by_node.get(node)
        if local:
            pick = local[next_on_node[node] % len(local)]
            next_on_node[node] += 1
            out[i] = pick
            load[pick] += 1
        else:
            orphans.append(i)
    heap = [(n, r) for r, n in load.items()]
    heapq.heapify(heap)
    for i in orphans:
        n, r = heapq.heappop(heap)
        out[i] = r
        heapq.heappush(heap, (n + 1, r))
    return out


def plan_layout(roles: RolesConfig, world_size: int, node_of_rank: np.ndarray | None = None) -> Layout:
    """The plan for `world_size` ranks; `node_of_rank[r]` is rank r's node id (default: all on one)."""
    if world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {world_size}")
    if world_size == 1:
        zero = np.zeros(1, dtype=np.int64)
        return Layout(1, zero, np.zeros(0, dtype=np.int64), zero, np.full(1, INLINE, dtype=np.int64), zero)
    counts = resolve_role_counts(roles, world_size)
    if node_of_rank is None:
        node_of_rank = np.zeros(world_size, dtype=np.int64)
    node_of_rank = np.asarray(node_of_rank)
    if len(node_of_rank) != world_size:
        raise ValueError(f"node_of_rank has {len(node_of_rank)} entries for world size {world_size}")
    n_learn, n_inf, n_env = counts["learner"], counts["inference"], counts["env"]
    if n_env < max(n_learn, n_inf):
        raise ConfigError(f"roles: {n_env} env ranks cannot feed {n_learn} learner and {n_inf} inference ranks "
                          f"(each needs at least one env rank); use at least {max(n_learn, n_inf)} env ranks")
    ranks = np.arange(world_size, dtype=np.int64)
    learners, inference, envs = ranks[:n_learn], ranks[n_learn:n_learn + n_inf], ranks[n_learn + n_inf:]
    env_learner = learners[np.arange(n_env) % n_learn]
    env_inference = _route_to_inference(envs, inference, node_of_rank)
    return Layout(world_size, learners, inference, envs, env_inference, env_learner)
