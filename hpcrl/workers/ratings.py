"""The learning policy's rating against fixed anchors (algo.selfplay.anchors), by OpenSkill's
Plackett-Luce model: a maintained rating library, not a formula of our own.

Each anchor's rating is fixed: its mean is the config's (`rating`), its uncertainty ANCHOR_SIGMA,
and what a game would change of it is thrown away, so the anchors are the scale the policy is
placed on. The policy's rating starts at OpenSkill's prior and moves with every game judged
against an anchor. A learner update brings a batch of games (wins, draws and losses against each
anchor, from every env rank); they are rated in an order that spreads each outcome evenly over
the batch, so a batch of 8 wins and 2 losses does not first climb on 8 wins and then fall on 2.
The model's tau (its default) keeps the policy's uncertainty from collapsing, as the policy itself
keeps changing.

Metrics: `rating` (mu, the estimate), `rating.sigma` (its uncertainty) and `rating.ordinal`
(mu - 3 sigma, OpenSkill's leaderboard value: a rating held with high confidence, which also
rises as the uncertainty shrinks, so a learning curve draws mu). The learner root checkpoints
(mu, sigma, games rated); every trainer computes the same rating from the same summed games.

A population member in self-play with anchors is judged on its rating's mu (`fitness`; a fresh
copy's wide uncertainty would sink its ordinal whatever its play): NaN until
MIN_RATED_GAMES games have been rated, as a mean return needs that many episodes. A member that
copies another's state starts again from the prior (`reset`), so its next judgement is of the copy.
"""
from __future__ import annotations

import numpy as np

ANCHOR_SIGMA = 1.0  # an anchor's rating is given, not estimated
MIN_RATED_GAMES = 20  # as hpcrl.workers.trainer_stats.RETURN_WINDOW_EPISODES
RANKS = ([0, 1], [0, 0], [1, 0])  # OpenSkill's ranks (lower is better) of (policy, anchor): win, draw, loss


def spread(counts: np.ndarray) -> list[int]:
    """The outcomes (0 win, 1 draw, 2 loss) of `counts` games each, in an order that spreads every
    outcome evenly: the i-th of c games of an outcome sits at (i + 0.5) / c of the batch."""
    slots = [((i + 0.5) / c, outcome) for outcome, c in enumerate(int(n) for n in counts) for i in range(c)]
    return [outcome for _, outcome in sorted(slots)]


class AnchorRating:
    def __init__(self, anchor_ratings: dict[str, float], state: np.ndarray | None = None):
        """`anchor_ratings`: {name: fixed mean}, in the config's order; `state`: (mu, sigma, games
        rated) of a resumed run's policy."""
        from openskill.models import PlackettLuce  # learners of runs with anchors only
        self.model = PlackettLuce()
        self.anchors = [self.model.rating(mu=mu, sigma=ANCHOR_SIGMA, name=name) for name, mu in anchor_ratings.items()]
        self.reset()
        if state is not None:
            mu, sigma, games = (float(v) for v in state)
            self.policy, self.games = self.model.rating(mu=mu, sigma=sigma, name="policy"), int(games)

    def reset(self) -> None:
        """The policy's rating back to OpenSkill's prior, no game rated."""
        self.policy, self.games = self.model.rating(name="policy"), 0

    def add(self, games: np.ndarray) -> None:
        """Rate the games of one update: `games[k]` = (wins, draws, losses) against anchor k."""
        for anchor, counts in zip(self.anchors, games):
            for outcome in spread(counts):
                (self.policy,), _ = self.model.rate([[self.policy], [anchor]], ranks=RANKS[outcome])
                self.games += 1

    def columns(self) -> dict[str, float]:
        return {"rating": float(self.policy.mu), "rating.sigma": float(self.policy.sigma),
                "rating.ordinal": float(self.policy.ordinal())}

    def fitness(self) -> float:
        """The rating (mu) once MIN_RATED_GAMES games are rated, else NaN."""
        return float(self.policy.mu) if self.games >= MIN_RATED_GAMES else float("nan")

    def state(self) -> np.ndarray:
        return np.array([self.policy.mu, self.policy.sigma, self.games], dtype=np.float64)
