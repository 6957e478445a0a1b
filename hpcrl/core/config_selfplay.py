"""The config section of self-play against a pool of past versions (algo.selfplay).

In a game of several seats, each new game either pits the learning policy against itself (every
seat learns) or gives one seat, drawn at random, to the learning policy and every other seat to a
frozen past version from the pool, drawn uniformly or by prioritized fictitious self-play (PFSP).
Each policy holder keeps the pool itself: every `snapshot_every` policy versions it copies the
newest weights into its oldest slot, so no weights travel for it and a pool member is just another
policy id that the holders serve.
"""
from __future__ import annotations

from dataclasses import dataclass

from hpcrl.core.config_base import check, doc
from hpcrl.core.population import PFSP_WEIGHTINGS

MAX_POOL = 64  # pool members per holder: each is a whole copy of the policy


@dataclass
class SelfPlayConfig:
    """Self-play against a pool of frozen past versions (multi-agent games)."""

    pool: int = doc("past versions kept to play against (0: the policy only ever plays itself); games against "
                    "them train the learning seat alone, and metrics.h5 gets a win rate per pool age", default=0)
    snapshot_every: int = doc("policy versions between snapshots into the pool (the oldest member gives way)",
                              default=20)
    latest: float = doc("share of games in which the policy plays itself; the others go to a pool member drawn "
                        "as `opponents` says", default=0.5)
    opponents: str = doc("how a game against the pool picks its pool age: 'uniform' (every age alike), or "
                         "prioritized fictitious self-play on the win rate p against each age: 'hard' weighs "
                         "an age by (1 - p)^2 (the ages it loses to), 'variance' by p(1 - p) (the ages it wins "
                         "half the time). Each env rank keeps p per age itself, an EMA of its own games",
                         default="uniform")
    payoff_decay: float = doc("decay of that EMA per judged game (AlphaStar's 0.99); a win counts 1, a draw 0.5, "
                              "a loss 0, and every age starts at 0.5", default=0.99)


def validate_selfplay(s: SelfPlayConfig, multiagent: bool, policies: int) -> None:
    if not s.pool:
        return
    check(0 < s.pool <= MAX_POOL, f"algo.selfplay.pool: expected 0 to {MAX_POOL}, got {s.pool}")
    check(s.snapshot_every >= 1, f"algo.selfplay.snapshot_every: expected >= 1, got {s.snapshot_every}")
    check(s.opponents in PFSP_WEIGHTINGS, f"algo.selfplay.opponents: expected one of "
                                          f"{', '.join(PFSP_WEIGHTINGS)}, got {s.opponents!r}")
    check(0.0 <= s.payoff_decay < 1.0, f"algo.selfplay.payoff_decay: expected a decay in [0, 1), got {s.payoff_decay}")
    check(0.0 <= s.latest < 1.0, f"algo.selfplay.latest: expected a share in [0, 1) (1 would never use the "
                                 f"pool; set pool: 0 instead), got {s.latest}")
    check(multiagent, "algo.selfplay.pool: self-play needs a game of several agents (algo.name mappo or ippo)")
    check(policies <= 1, "algo.selfplay.pool: a pool of past versions is kept for a run of one policy; remove "
                         "the policies table or set pool: 0")
