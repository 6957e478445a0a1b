"""The config section of self-play against a pool of past versions (algo.selfplay).

In a game of several seats, each new game either pits the learning policy against itself (every
seat learns) or gives one seat, drawn at random, to the learning policy and every other seat to a
frozen past version from the pool. Each policy holder keeps the pool itself: every
`snapshot_every` policy versions it copies the newest weights into its oldest slot, so no weights
travel for it and a pool member is just another policy id that the holders serve.
"""
from __future__ import annotations

from dataclasses import dataclass

from hpcrl.core.config_base import check, doc

MAX_POOL = 64  # pool members per holder: each is a whole copy of the policy


@dataclass
class SelfPlayConfig:
    """Self-play against a pool of frozen past versions (multi-agent games)."""

    pool: int = doc("past versions kept to play against (0: the policy only ever plays itself); games against "
                    "them train the learning seat alone, and metrics.h5 gets a win rate per pool age", default=0)
    snapshot_every: int = doc("policy versions between snapshots into the pool (the oldest member gives way)",
                              default=20)
    latest: float = doc("share of games in which the policy plays itself; the others go to a pool member drawn "
                        "uniformly", default=0.5)


def validate_selfplay(s: SelfPlayConfig, multiagent: bool, policies: int) -> None:
    if not s.pool:
        return
    check(0 < s.pool <= MAX_POOL, f"algo.selfplay.pool: expected 0 to {MAX_POOL}, got {s.pool}")
    check(s.snapshot_every >= 1, f"algo.selfplay.snapshot_every: expected >= 1, got {s.snapshot_every}")
    check(0.0 <= s.latest < 1.0, f"algo.selfplay.latest: expected a share in [0, 1) (1 would never use the "
                                 f"pool; set pool: 0 instead), got {s.latest}")
    check(multiagent, "algo.selfplay.pool: self-play needs a game of several agents (algo.name mappo or ippo)")
    check(policies <= 1, "algo.selfplay.pool: a pool of past versions is kept for a run of one policy; remove "
                         "the policies table or set pool: 0")
