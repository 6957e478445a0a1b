"""Who does what: turn the rank-role table, a world size and a node map into a plan for every rank.

Pure numpy (no MPI), so it can be tested with simulated node maps, and vectorised so it plans
100,000 ranks in a fraction of a second. Placement, in this order:
- learners take the lowest free ranks (the learner root is the lowest learner rank);
- inference and env ranks with a total count are spread round-robin over the nodes;
- a role with `per_node: k` takes the k lowest free ranks of every node;
- a role with `place: high` takes the highest free ranks instead (GPU nodes listed last);
- the role with `ranks: rest` takes every rank left over.
Each env rank talks to one inference rank and one learner, on its own node where the node has
one, else to the least-loaded one elsewhere, so fan-in stays balanced.
What a layout implies for batches, sample slots and replay shards is worked out once from it, in
`hpcrl.core.sizing.Sizes`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hpcrl.core.config import REST, ROLE_NAMES, ConfigError, RolesConfig

INLINE = -1  # env_inference entry for an env rank that runs its policy itself


def _role_table(roles: RolesConfig) -> str:
    parts = []
    for r in ROLE_NAMES:
        spec = getattr(roles, r)
        parts.append(f"{r} {spec.per_node}/node" if spec.per_node is not None else f"{r} {spec.ranks}")
    return " + ".join(parts)


def resolve_role_counts(roles: RolesConfig, world_size: int, num_nodes: int = 1) -> dict[str, int]:
    """Role -> number of ranks for this world size; a ConfigError says which sizes would fit."""
    fixed = {}
    for r in ROLE_NAMES:
        spec = getattr(roles, r)
        if spec.per_node is not None:
            fixed[r] = spec.per_node * num_nodes
        elif spec.ranks != REST:
            fixed[r] = spec.ranks
    rest = [r for r in ROLE_NAMES if r not in fixed]
    needed = sum(fixed.values())
    table = _role_table(roles)
    where = f"{world_size} ranks" + (f" on {num_nodes} nodes" if num_nodes > 1 else "")
    if rest:
        left = world_size - needed
        minimum = needed + (1 if rest[0] in ("env", "learner") else 0)
        if left < 0 or (left == 0 and rest[0] in ("env", "learner")):
            raise ConfigError(f"roles ({table}) need a world size of at least {minimum}, "
                              f"but the job has {where}; run with mpirun -n {minimum} or more")
        return {**fixed, rest[0]: left}
    if needed != world_size:
        raise ConfigError(f"roles ({table}) need a world size of exactly {needed}, but the job has "
                          f"{where}; run with mpirun -n {needed}, or set one role's ranks to "
                          f"'rest' to fill any size")
    return fixed


@dataclass(frozen=True)
class Layout:
    """The whole job's plan. Arrays are indexed by role index; entries are world ranks."""

    world_size: int
    node_of_rank: np.ndarray
    learners: np.ndarray
    inference: np.ndarray
    envs: np.ndarray
    env_inference: np.ndarray  # per env index: world rank of its inference rank, or INLINE
    # [policy, env index]: world rank of the learner that trains that policy on the env rank's
    # records. The learners are split into one block per policy (core/policies.py), in order.
    env_learners: np.ndarray

    @property
    def env_learner(self) -> np.ndarray:
        """Per env index: its learner, in a run of one policy (the first policy's otherwise)."""
        return self.env_learners[0]

    @property
    def policies(self) -> int:
        return self.env_learners.shape[0]

    def policy_of_learner(self, rank: int) -> int:
        """The policy a learner rank trains: learners come in equal blocks, one per policy."""
        return self.index_in("learner", rank) // self.learners_per_policy

    @property
    def learners_per_policy(self) -> int:
        """The learners that train one policy (all of them in a run of one policy): a batch
        (algo.batch_frames) is shared by these."""
        return len(self.learners) // self.policies

    def learners_of_policy(self, policy: int) -> np.ndarray:
        block = self.learners_per_policy
        return self.learners[policy * block:(policy + 1) * block]

    @property
    def serial(self) -> bool:
        """World size 1: rank 0 is learner and env at once, with inline inference."""
        return self.world_size == 1

    @property
    def inline_inference(self) -> bool:
        return len(self.inference) == 0

    @property
    def learner_root(self) -> int:
        return int(self.learners[0])

    def roles_of(self, rank: int) -> tuple[str, ...]:
        return tuple(name for name, ranks in (("learner", self.learners), ("inference", self.inference),
                                              ("env", self.envs)) if np.any(ranks == rank))

    def index_in(self, role: str, rank: int) -> int:
        ranks = {"learner": self.learners, "inference": self.inference, "env": self.envs}[role]
        return int(np.flatnonzero(ranks == rank)[0])

    def envs_of_inference(self, rank: int) -> list[int]:
        return [int(r) for r in self.envs[self.env_inference == rank]]

    def envs_of_learner(self, rank: int) -> list[int]:
        return [int(r) for r in self.envs[self.env_learners[self.policy_of_learner(rank)] == rank]]

    def fan_in(self, role: str) -> np.ndarray:
        """Env ranks per learner (or per inference rank), in role-index order."""
        servers, routes = ((self.learners, self.env_learners.reshape(-1)) if role == "learner"
                           else (self.inference, self.env_inference))
        if len(servers) == 0:
            return np.zeros(0, dtype=np.int64)
        order = np.argsort(servers)
        counts = np.zeros(len(servers), dtype=np.int64)
        np.add.at(counts, order[np.searchsorted(servers[order], routes)], 1)
        return counts

    def weight_subscribers(self) -> list[int]:
        """Ranks that hold a policy copy fed by the learner root: inference ranks, else env ranks."""
        ranks = self.envs if self.inline_inference else self.inference
        return [int(r) for r in ranks if r != self.learner_root]


def _local_positions(free: np.ndarray, node_of_rank: np.ndarray) -> np.ndarray:
    """For each free rank (ascending), its position among the free ranks of its node."""
    nodes = node_of_rank[free]
    order = np.argsort(nodes, kind="stable")
    sorted_nodes = nodes[order]
    starts = np.flatnonzero(np.r_[True, sorted_nodes[1:] != sorted_nodes[:-1]])
    group_start = np.repeat(starts, np.diff(np.r_[starts, len(order)]))
    pos = np.empty(len(free), dtype=np.int64)
    pos[order] = np.arange(len(order)) - group_start
    return pos


def _ordered(free: np.ndarray, place: str) -> np.ndarray:
    """The free ranks in the order a role takes them: lowest first, or (place: high) highest first."""
    return free[::-1] if place == "high" else free


def _place(role: str, count: int, per_node: int | None, free: np.ndarray, node_of_rank: np.ndarray,
           num_nodes: int) -> np.ndarray:
    """World ranks (ascending) for one role, chosen among the free (eligible) ranks, taken in the
    order given (ascending, or descending for place: high)."""
    if per_node is None and len(free) < count:
        raise ConfigError(f"roles.{role}: {count} ranks needed but only {len(free)} suitable ranks are free")
    if role == "learner" and per_node is None:
        return np.sort(free[:count])
    pos = _local_positions(free, node_of_rank)
    if per_node is not None:
        chosen = np.sort(free[pos < per_node])
        short = num_nodes * per_node - len(chosen)
        if short:
            raise ConfigError(f"roles.{role}.per_node: {per_node} {role} ranks per node do not fit: "
                              f"some nodes have fewer free ranks left; use more ranks per node or a smaller per_node")
        return chosen
    order = np.lexsort((node_of_rank[free], pos))  # round-robin: first free rank of every node, then second...
    return np.sort(free[order[:count]])


def _route(envs: np.ndarray, servers: np.ndarray, node_of_rank: np.ndarray) -> np.ndarray:
    """Each env rank -> one server rank: round-robin among servers on its own node; env ranks on
    nodes without one fill the least-loaded servers up to an even share, grouped by node."""
    out = np.full(len(envs), INLINE, dtype=np.int64)
    if len(servers) == 0:
        return out
    server_nodes = node_of_rank[servers]
    by_node = np.argsort(server_nodes, kind="stable")
    sorted_servers, sorted_nodes = servers[by_node], server_nodes[by_node]
    env_nodes = node_of_rank[envs]
    first = np.searchsorted(sorted_nodes, env_nodes, side="left")
    local_count = np.searchsorted(sorted_nodes, env_nodes, side="right") - first
    has_local = local_count > 0
    local_envs = np.flatnonzero(has_local)
    pos = _local_positions(envs[local_envs], node_of_rank) if len(local_envs) else np.zeros(0, dtype=np.int64)
    out[local_envs] = sorted_servers[first[local_envs] + pos % local_count[local_envs]]
    orphans = np.flatnonzero(~has_local)
    if len(orphans):
        orphans = orphans[np.argsort(env_nodes[orphans], kind="stable")]
        ascending = np.sort(servers)
        load = np.bincount(np.searchsorted(ascending, out[local_envs]), minlength=len(servers))
        quota = np.full(len(servers), len(envs) // len(servers))  # even shares, differing by at most one
        quota[: len(envs) % len(servers)] += 1
        fill = np.repeat(ascending, np.maximum(quota - load, 0))
        if len(fill) < len(orphans):  # local shares already above the even share somewhere
            fill = np.r_[fill, np.resize(ascending, len(orphans) - len(fill))]
        out[orphans] = fill[:len(orphans)]
    return out


def plan_layout(roles: RolesConfig, world_size: int, node_of_rank: np.ndarray | None = None,
                gpus_of_rank: np.ndarray | None = None, policies: int = 1) -> Layout:
    """The plan for `world_size` ranks; `node_of_rank[r]` is rank r's node id (default: all on one);
    `gpus_of_rank[r]` the GPUs rank r's node has (default: unknown, no constraint). Roles with
    `device: cuda` are placed only on ranks whose node has a GPU. `policies`: the learners split
    into that many equal blocks, each routed to every env rank."""
    if world_size < 1:
        raise ConfigError(f"world size must be >= 1, got {world_size}")
    if policies > 1 and world_size == 1:
        raise ConfigError(f"policies: {policies} policies train on {policies} blocks of learner ranks, which world "
                          f"size 1 (serial mode) cannot give; run with mpirun -n 4 or more")
    if node_of_rank is None:
        node_of_rank = np.zeros(world_size, dtype=np.int64)
    node_of_rank = np.asarray(node_of_rank, dtype=np.int64)
    if len(node_of_rank) != world_size:
        raise ValueError(f"node_of_rank has {len(node_of_rank)} entries for world size {world_size}")
    if world_size == 1:
        zero = np.zeros(1, dtype=np.int64)
        return Layout(1, node_of_rank, zero, np.zeros(0, dtype=np.int64), zero, np.full(1, INLINE, dtype=np.int64),
                      zero[None])
    num_nodes = len(np.unique(node_of_rank))
    counts = resolve_role_counts(roles, world_size, num_nodes)
    n_learn, n_inf, n_env = counts["learner"], counts["inference"], counts["env"]
    if n_learn % policies:
        raise ConfigError(f"roles.learner: {n_learn} learner ranks cannot be split evenly over {policies} policies "
                          f"(each trains on a block of its own); use a multiple of {policies}, such as "
                          f"{policies * max(1, n_learn // policies)} or {policies * (n_learn // policies + 1)}")
    per_policy = n_learn // policies  # every env rank feeds one learner of each policy
    if n_env < max(per_policy, n_inf):
        learners = f"{n_learn} learner" + (f" ({per_policy} per policy)" if policies > 1 else "")
        raise ConfigError(f"roles: {n_env} env ranks cannot feed {learners} and {n_inf} inference ranks "
                          f"(each needs at least one env rank); use at least {max(per_policy, n_inf)} env ranks")
    free = np.arange(world_size, dtype=np.int64)
    placed: dict[str, np.ndarray] = {}
    rest_role = None
    for role in ROLE_NAMES:
        spec = getattr(roles, role)
        if spec.per_node is None and spec.ranks == REST:
            rest_role = role
            continue
        if spec.device == "cuda" and gpus_of_rank is not None:
            gpu_nodes = len(np.unique(node_of_rank[gpus_of_rank > 0]))
            if gpu_nodes == 0:
                raise ConfigError(f"roles.{role}.device is 'cuda' but no node of this job has a GPU it may use "
                                  f"(check the allocation and CUDA_VISIBLE_DEVICES), or use device: cpu")
            eligible = free[gpus_of_rank[free] > 0]
            if spec.per_node is not None and gpu_nodes < num_nodes:
                raise ConfigError(f"roles.{role}: device cuda with per_node needs a GPU on every node, but only "
                                  f"{gpu_nodes} of {num_nodes} nodes have one")
            try:
                placed[role] = _place(role, counts[role], spec.per_node, _ordered(eligible, spec.place), node_of_rank,
                                      gpu_nodes if spec.per_node is not None else num_nodes)
            except ConfigError as exc:
                raise ConfigError(f"{exc} (device cuda: only ranks on the {gpu_nodes} nodes with a GPU qualify)") from None
        else:
            placed[role] = _place(role, counts[role], spec.per_node, _ordered(free, spec.place), node_of_rank,
                                  num_nodes)
        free = np.setdiff1d(free, placed[role], assume_unique=True)
    if rest_role is not None:
        if getattr(roles, rest_role).device == "cuda" and gpus_of_rank is not None and np.any(gpus_of_rank[free] == 0):
            raise ConfigError(f"roles.{rest_role}: ranks: rest with device cuda would put {rest_role} ranks on "
                              f"nodes without a GPU; give it a count or per_node instead")
        placed[rest_role] = free
    learners, inference, envs = placed["learner"], placed["inference"], placed["env"]
    return Layout(world_size, node_of_rank, learners, inference, envs,
                  env_inference=_route(envs, inference, node_of_rank),
                  env_learners=np.stack([_route(envs, block, node_of_rank)
                                         for block in np.split(learners, policies)]))


def simulated_nodes(world_size: int, ranks_per_node: int) -> np.ndarray:
    """Node ids for a block placement (SLURM's default): ranks 0..C-1 on node 0, and so on."""
    if ranks_per_node < 1:
        raise ConfigError(f"--ranks-per-node: expected >= 1, got {ranks_per_node}")
    return np.arange(world_size, dtype=np.int64) // ranks_per_node
