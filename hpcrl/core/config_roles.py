"""The rank-role table (roles): how many ranks play each role, where, and on which device.

hpcrl.core.layout turns it into each rank's roles; hpcrl.core.config re-exports these names.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from hpcrl.core.config_base import NON_NEGATIVE, OneOf, check, check_ranges, doc

REST = "rest"
ROLE_NAMES = ("learner", "inference", "env")
DEVICES = ("cpu", "cuda")
DEFAULT_RANKS = {"learner": 1, "inference": 0, "env": REST}
DEFAULT_MAX_ENV_RANKS = 256  # per learner or inference rank, when roles.X.max_env_ranks is not set


@dataclass
class RoleSpec:
    """How many ranks play one role, and on which device."""

    ranks: Union[int, str, None] = doc("number of ranks for this role in total, or 'rest' for all ranks "
                                       "left over (default: learner 1, inference 0, env rest)", default=None)
    per_node: Union[int, None] = doc("ranks of this role on every node, instead of a total `ranks`", default=None)
    device: str = doc("torch device for this role's policy: 'cpu' or 'cuda'", range=OneOf(DEVICES), default="cpu")
    place: str = doc("which ranks the role takes: 'low' (the lowest free ranks; learners are placed first, so "
                     "the learner root is rank 0) or 'high' (the highest, e.g. when a heterogeneous job lists "
                     "its GPU nodes last)", range=OneOf(("low", "high")), default="low")
    max_env_ranks: Union[int, None] = doc(
        "learner and inference: the most env ranks one such rank should serve; hpcrl plan and the run warn "
        "above it (default 256: beyond that one server's per-poll work and buffers dominate; 0 = no limit)",
        range=NON_NEGATIVE, default=None)
    sample_slots: Union[int, None] = doc(
        "learner: fragments one learner holds or has in flight at once, its sample stream's memory bound "
        "(this x the fragment size, whatever the MPI eager limit); an env rank without a free slot waits "
        "(credit flow control). At least one batch: a fragment per env rank it trains on, or as "
        "algo.batch_frames sets (sync mode with more than two fragments per env rank and version: also two "
        "per other env rank, for the credits of env ranks that have sent their share). Default: the larger of "
        "two per env rank and a batch plus one per env rank (and never below that minimum), so the next batch "
        "arrives while one trains; async mode: at least a batch plus two per other env rank, so that env ranks "
        "stalled with their credits (a stopped node) never keep the others from making a batch; DQN: one per "
        "env rank, since records held back for the replay ratio grow old", default=None)


@dataclass
class RolesConfig:
    """The rank-role table: learners take the lowest ranks, then inference, then env ranks."""

    learner: RoleSpec = doc("ranks that train (Horovod among them)", default_factory=RoleSpec)
    inference: RoleSpec = doc("ranks that batch observations and run the policy; 0 = inline on env ranks",
                              default_factory=RoleSpec)
    env: RoleSpec = doc("ranks that step gymnasium environments", default_factory=RoleSpec)


def validate_roles(roles: RolesConfig) -> None:
    """Each role's counts, placement and device; fills in the default rank counts."""
    for role in ROLE_NAMES:
        spec: RoleSpec = getattr(roles, role)
        key = f"roles.{role}"
        check_ranges(spec, key)
        check(spec.ranks is None or spec.per_node is None,
              f"{key}: set either ranks (a total) or per_node (on every node), not both")
        if spec.per_node is not None:
            check(spec.per_node >= (0 if role == "inference" else 1),
                  f"{key}.per_node: expected >= {0 if role == 'inference' else 1}, got {spec.per_node}")
        check(spec.ranks is None or spec.ranks == REST or (isinstance(spec.ranks, int) and spec.ranks >= 0),
              f"{key}.ranks: expected a count >= 0 or 'rest', got {spec.ranks!r}")
        check(role != "env" or not spec.max_env_ranks,
              f"{key}.max_env_ranks: only learner and inference ranks serve env ranks")
        check(spec.place == "low" or spec.ranks != REST,
              f"{key}.place: a role with ranks: rest takes every rank left over; give it a count to place it high")
        check(spec.sample_slots is None or (role == "learner" and spec.sample_slots >= 1),
              f"{key}.sample_slots: " + ("expected >= 1 (or null)" if role == "learner"
                                        else "only learners receive fragments; set roles.learner.sample_slots"))
    rest = [r for r in ROLE_NAMES if getattr(roles, r).ranks == REST]
    check(len(rest) <= 1, f"roles: only one role may use ranks: rest, got {', '.join(rest)}")
    check(roles.learner.ranks != 0, "roles.learner.ranks: at least 1 learner rank is needed")
    check(roles.env.ranks != 0, "roles.env.ranks: at least 1 env rank is needed")
