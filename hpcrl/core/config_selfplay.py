"""The config section of self-play against a pool of past versions (algo.selfplay).

In a game of several seats, each new game either pits the learning policy against itself (every
seat learns) or gives one seat, drawn at random, to the learning policy and every other seat to a
frozen past version from the pool, drawn uniformly or by prioritized fictitious self-play (PFSP).
Each policy holder keeps the pool itself: every `snapshot_every` policy versions it copies the
newest weights into its oldest slot, so no weights travel for it and a pool member is just another
policy id that the holders serve.

Anchors are fixed players written as functions (`module:function`, envs/scripted.py), such as a
uniform-random and a one-step-lookahead player: a share of games gives one seat to the learning
policy and the others to an anchor, played on the env rank itself, and is never trained on: the
games measure the policy, they do not teach it the anchors. Each anchor has a fixed rating;
the learning policy's rating (OpenSkill's Plackett-Luce model) is updated from its games against
them, and metrics.h5 records it with the win rate against each anchor.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from hpcrl.core.config_base import AT_LEAST_ONE, OneOf, Range, check, check_ranges, doc, shown
from hpcrl.core.population import PFSP_WEIGHTINGS

MAX_POOL = 64  # pool members per holder: each is a whole copy of the policy
MAX_ANCHORS = 16
ANCHOR_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")  # a metrics column's part: anchor.NAME.win_rate
DEFAULT_RATING = 25.0  # OpenSkill's prior mean, the rating of an anchor that declares none


@dataclass
class SelfPlayConfig:
    """Self-play against a pool of frozen past versions (multi-agent games)."""

    pool: int = doc("past versions kept to play against (0: the policy only ever plays itself); games against "
                    "them train the learning seat alone, and metrics.h5 gets a win rate per pool age",
                    range=Range(0, MAX_POOL, words=f"0 to {MAX_POOL}"), default=0)
    snapshot_every: int = doc("policy versions between snapshots into the pool (the oldest member gives way)",
                              range=AT_LEAST_ONE, default=20)
    latest: float = doc("share of games in which the policy plays itself; the others, but the anchors' share, go "
                        "to a pool member drawn as `opponents` says",
                        range=Range(0, 1, below=True,
                                    words="a share in [0, 1) (1 would never use the pool; set pool: 0 instead)"),
                        default=0.5)
    opponents: str = doc("how a game against the pool picks its pool age: 'uniform' (every age alike), or "
                         "prioritized fictitious self-play on the win rate p against each age: 'hard' weighs "
                         "an age by (1 - p)^2 (the ages it loses to), 'variance' by p(1 - p) (the ages it wins "
                         "half the time). Each env rank keeps p per age itself, an EMA of its own games",
                         range=OneOf(PFSP_WEIGHTINGS), default="uniform")
    payoff_decay: float = doc("decay of that EMA per judged game (AlphaStar's 0.99); a win counts 1, a draw 0.5, "
                              "a loss 0, and every age starts at 0.5",
                              range=Range(0, 1, below=True, words="a decay in [0, 1)"), default=0.99)
    anchors: dict = doc("fixed players to rate the policy against, by name: 'module:function' (a function of "
                        "(obs, action_mask, numpy generator) returning an action per row, imported from the "
                        "Python path), or {player: 'module:function', rating: MU} to fix the anchor's rating "
                        f"(default {DEFAULT_RATING:g}, OpenSkill's prior)", default_factory=dict)
    anchor_share: float = doc("share of games in which the learning policy plays one seat against an anchor "
                              "(drawn uniformly) in every other; they only measure: no seat of them is trained on, "
                              "so the rating is the policy's, not what it learned from the anchors", default=0.1)

    def anchor_players(self) -> dict[str, str]:
        """{name: 'module:function'} of the anchors."""
        return {name: a if isinstance(a, str) else a["player"] for name, a in self.anchors.items()}

    def anchor_ratings(self) -> dict[str, float]:
        """{name: fixed rating} of the anchors."""
        return {name: DEFAULT_RATING if isinstance(a, str) else float(a.get("rating", DEFAULT_RATING))
                for name, a in self.anchors.items()}

    @property
    def opponents_count(self) -> int:
        """What a game can be judged against: the pool's ages, then the anchors."""
        return self.pool + len(self.anchors)


def validate_selfplay(s: SelfPlayConfig, multiagent: bool, policies: int) -> None:
    _validate_anchors(s)
    if not s.pool and not s.anchors:
        return
    check_ranges(s, "algo.selfplay")
    if s.anchors:
        check(0.0 < s.anchor_share < 1.0, f"algo.selfplay.anchor_share: expected a share in (0, 1), got "
                                          f"{s.anchor_share}")
        check(not s.pool or s.latest + s.anchor_share < 1.0,
              f"algo.selfplay.anchor_share: {s.anchor_share} and latest {s.latest} leave no games for the pool "
              f"(latest + anchor_share < 1 with a pool; or set pool: 0)")
    what = "algo.selfplay.pool" if s.pool else "algo.selfplay.anchors"
    check(multiagent, f"{what}: self-play needs a game of several agents (algo.name mappo or ippo)")
    check(policies <= 1, f"{what}: a pool of past versions and anchors are kept for a run of one policy; remove "
                         f"the policies table, or set pool: 0 and anchors: {{}}")


def _validate_anchors(s: SelfPlayConfig) -> None:
    """Names fit a metrics column; each is module:function or {player, rating} (whether the module
    imports is checked when a run starts: launch/run.py)."""
    check(isinstance(s.anchors, dict) and len(s.anchors) <= MAX_ANCHORS,
          lambda: f"algo.selfplay.anchors: expected a mapping of at most {MAX_ANCHORS} names to players, "
                  f"got {shown(s.anchors)}")
    for name, anchor in s.anchors.items():
        where = f"algo.selfplay.anchors.{name}"
        check(isinstance(name, str) and ANCHOR_NAME.fullmatch(name) is not None,
              lambda: f"algo.selfplay.anchors: {shown(name)} is no anchor name; expected a letter, then up to 31 "
                      f"letters, digits or _ (it names metrics columns)")
        if isinstance(anchor, dict):
            check(set(anchor) <= {"player", "rating"} and "player" in anchor,
                  lambda: f"{where}: expected {{player: module:function, rating: MU}}, got {shown(anchor)}")
            rating = anchor.get("rating", DEFAULT_RATING)
            check(isinstance(rating, (int, float)) and not isinstance(rating, bool) and math.isfinite(rating),
                  lambda: f"{where}.rating: expected a finite number, got {shown(rating)}")
            anchor = anchor["player"]
        check(isinstance(anchor, str) and anchor.count(":") == 1 and all(anchor.split(":")),
              lambda: f"{where}: expected 'module:function' (e.g. hpcrl.envs.anchors:uniform), got {shown(anchor)}")
