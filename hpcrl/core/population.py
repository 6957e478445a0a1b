"""The decisions of a population: population-based training's exploit and explore, the
lineage they leave, and prioritized fictitious self-play's opponent weights.

Pure numpy, no MPI and no torch: one decider (the population root) calls these with the fitness
its members report and its own seeded generator, so a decision is the same whatever the rank
count, and every case can be checked by hand (tests/test_population.py). Moving a member's state
is the transport's part (runtime/member_copy.py).

- Exploit (truncation selection, as SRL, Sample Factory and Ray Tune's PBT do): a member that has
  trained `ready_frames` since its last decision and ranks in the bottom `truncation` fraction of
  the population's fitness copies the state of a member drawn uniformly from the top fraction. A
  member whose fitness is NaN (a diverged run, or no episode ended yet) ranks last, so it is
  replaced from a good member; ties keep member order, so no member is copied over an equal one.
- Explore: each declared key of the copied hyperparameters is multiplied by one of its `perturb`
  factors, drawn uniformly, or drawn anew from its `resample` values; the result is clipped to
  the key's bounds. Member 0 may be kept fixed (Sample Factory's habit, a control member).
- PFSP (AlphaStar's league): the weight of an opponent is f(p), p the learner's win rate against
  it: "hard" (1 - p)^2 favours the opponents it loses to, "variance" p(1 - p) those it wins half
  the time, "uniform" all alike.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

PFSP_WEIGHTINGS = ("hard", "variance", "uniform")
# The lineage, the population's metrics.h5: one row per event, with the member's live
# hyperparameters after it (a series per key, 'algo.lr'...). Events: a member's start (its
# config's values; a resumed launch writes none), a judgement that kept it, an exploit (it took
# `parent`'s state; `fitness` is its own before, `parent_fitness` the parent's), its stop, and
# an exploit cancelled: ordered, but the member had stopped (its last checkpoint written) before
# it could take it, so it never did (the row names the member and the parent of that exploit).
# In a league, a restart: an exploiter starts again from the newest snapshot of main agent `parent`
# (population.league.restart 'main'; ordered, taken unless the exploiter had stopped). A pause: a
# launch on too few ranks for every member left this one out (its checkpoint waits; `fitness` is
# the standing it keeps meanwhile).
START, JUDGED, EXPLOIT, STOPPED, CANCELLED, RESTART, PAUSED = 0, 1, 2, 3, 4, 5, 6
LINEAGE_KEYS = ("time_s", "event", "member", "parent", "frames", "fitness", "parent_fitness")


@dataclass(frozen=True)
class ExploreRule:
    """How explore changes one hyperparameter: multiply by one of `perturb`, or draw from
    `resample`; then clip to [low, high]."""

    key: str
    perturb: tuple[float, ...] = ()
    resample: tuple[float, ...] = ()
    low: float = -math.inf
    high: float = math.inf

    def __post_init__(self) -> None:
        if bool(self.perturb) == bool(self.resample):
            raise ValueError(f"explore rule for {self.key}: give either perturb factors or resample values")
        if self.low > self.high:
            raise ValueError(f"explore rule for {self.key}: low {self.low} is above high {self.high}")

    def apply(self, value: float, rng: np.random.Generator) -> float:
        new = value * self.perturb[rng.integers(len(self.perturb))] if self.perturb else \
            self.resample[rng.integers(len(self.resample))]
        return float(min(max(new, self.low), self.high))


def ranking(fitness: np.ndarray) -> np.ndarray:
    """Member ids from best to worst: higher fitness first, NaN last, ties in member order."""
    f = np.asarray(fitness, dtype=np.float64)
    key = np.where(np.isnan(f), -np.inf, f)
    return np.lexsort((np.arange(len(f)), np.isnan(f), -key))


def exploit_parent(member: int, fitness: np.ndarray, truncation: float, rng: np.random.Generator,
                   can_send: np.ndarray | None = None) -> int | None:
    """The member whose state `member` should copy now, or None when it stays itself: None unless
    it ranks in the bottom `truncation` fraction; else a member of the top fraction, uniformly,
    among those that `can_send` (default all: a paused member ranks, but holds no state in memory).
    The fractions hold at least one member each and never overlap."""
    n = len(fitness)
    if not 0.0 < truncation <= 0.5:
        raise ValueError(f"truncation: expected a fraction in (0, 0.5], got {truncation}")
    if n < 2:
        return None
    cut = max(1, int(math.floor(n * truncation)))
    order = ranking(fitness)
    if member not in order[n - cut:]:
        return None
    top = order[:cut] if can_send is None else [m for m in order[:cut] if can_send[m]]
    return int(top[rng.integers(len(top))]) if len(top) else None


@dataclass(frozen=True)
class Standing:
    """Where each member stands in a lineage (`standings`): what a paused member keeps."""
    fitness: np.ndarray  # its last fitness, NaN where none yet
    frames: np.ndarray  # its frames at its last row, 0 where none
    hyper: np.ndarray  # members x live keys: its hyperparameters after its last row, NaN where none


@dataclass(frozen=True)
class Paused:
    """The members a launch on too few ranks left out, and where the lineage left each one
    (`standing`; None: not read)."""
    members: tuple[int, ...]
    standing: Standing | None


def standings(lineage: dict[str, np.ndarray], members: int, live: tuple[str, ...]) -> Standing:
    """Each member's last word in the lineage: its fitness (its own at a judgement or a stop, its
    parent's at an exploit, since it took the parent's state, the one it kept at a pause), its
    frames and its `live` hyperparameters ('lr' for the series 'algo.lr'). Only whole rows: a kill
    inside an append leaves some series a row longer (io/metrics.read_metrics), and the lineage
    is read before its resume cuts it back; a lineage without a series read here has no standing
    to give."""
    fitness, frames = np.full(members, np.nan), np.zeros(members, dtype=np.int64)
    hyper = np.full((members, len(live)), np.nan)
    read = ["event", "member", "frames", "fitness", "parent_fitness", *(f"algo.{k}" for k in live)]
    rows = min(len(lineage[key]) for key in read if key in lineage) if all(key in lineage for key in read[:5]) else 0
    event, member = lineage.get("event", np.array([])), lineage.get("member", np.array([]))
    for i in range(rows):
        m = int(member[i])
        if not 0 <= m < members or event[i] == CANCELLED:
            continue
        frames[m] = max(frames[m], int(lineage["frames"][i]))
        hyper[m] = [lineage[f"algo.{k}"][i] if f"algo.{k}" in lineage else np.nan for k in live]
        value = lineage["parent_fitness"][i] if event[i] == EXPLOIT else lineage["fitness"][i]
        if not math.isnan(value):
            fitness[m] = value
    return Standing(fitness, frames, hyper)


def explore(hyperparameters: dict[str, float], rules: list[ExploreRule], rng: np.random.Generator) -> dict[str, float]:
    """The parent's hyperparameters with every rule's key changed (the others as they were)."""
    out = dict(hyperparameters)
    for rule in rules:
        if rule.key not in out:
            raise KeyError(f"explore rule for {rule.key}: the member has no such hyperparameter "
                           f"(it has {', '.join(sorted(out))})")
        out[rule.key] = rule.apply(float(out[rule.key]), rng)
    return out


def pfsp_weights(win_rates: np.ndarray, weighting: str = "hard") -> np.ndarray:
    """Probabilities of drawing each opponent, from the learner's win rate against each. Where
    every weight is zero (it beats every opponent always, under "hard"), uniform instead."""
    p = np.clip(np.asarray(win_rates, dtype=np.float64), 0.0, 1.0)
    if weighting == "hard":
        w = (1.0 - p) ** 2
    elif weighting == "variance":
        w = p * (1.0 - p)
    elif weighting == "uniform":
        w = np.ones_like(p)
    else:
        raise ValueError(f"PFSP weighting {weighting!r}: expected one of {', '.join(PFSP_WEIGHTINGS)}")
    total = w.sum()
    return w / total if total > 0 else np.full(len(p), 1.0 / len(p))


def exploits_taken(event: np.ndarray, member: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """The rows of the lineage's exploits that took effect: each CANCELLED row voids the latest
    exploit before it of the same member from the same parent."""
    taken = [i for i in range(len(event)) if event[i] == EXPLOIT]
    for i in np.flatnonzero(event == CANCELLED):
        match = [j for j in taken if j < i and member[j] == member[i] and parent[j] == parent[i]]
        taken.remove(match[-1])
    return np.array(taken, dtype=np.int64)
