"""The config section of a population (population-based training).

With `population.members: N` one job trains N members side by side. The world is cut into N
equal blocks of consecutive ranks (so a member stays on as few nodes as it can); each block runs
the roles table as a run of its own, in its own run directory inside the population's
(output_dir/name/memberNN), with its own seed (run.seed + its index) and its own hyperparameters
(`values`). Every `ready_frames` of its own training a member's fitness (the mean return of its
recent episodes) goes to the population root, which decides whether it copies a better member's
state (exploit) and how its hyperparameters change (explore): core/population.py.

Pure Python, like the rest of the config: `hpcrl plan` checks a population without MPI.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass

from hpcrl.core.config_base import (ConfigError, OneOf, Range, check, check_ranges, doc, is_number, number_as_text_hint,
                                     shown)
from hpcrl.core.population import PFSP_WEIGHTINGS, ExploreRule

MAX_KEEP = 256  # snapshots an owner keeps: each a whole copy of the policy on its learner root

MAX_MEMBERS = 100_000
EXPLORE_KEYS = ("perturb", "resample", "low", "high")
RESTARTS = ("initial", "main")  # population.league.restart
FEWER_RANKS = ("pack", "pause")  # population.fewer_ranks


@dataclass
class LeagueConfig:
    """League self-play (core/league.py): members as main agents and exploiters, playing each other's snapshots."""

    main: int = doc("main agents (members 0..main-1): they play every snapshot the league keeps, by PFSP, and "
                    "themselves in algo.selfplay.latest of their games (0: no league)", default=0)
    main_exploiters: int = doc("main exploiters (the next members): they play the main agents' newest snapshots "
                               "only, and start again (restart says from what) at each of their own snapshots",
                               default=0)
    league_exploiters: int = doc("league exploiters (the last members): they play every snapshot by PFSP, and "
                                 "start again with probability exploiter_reset at each of their own snapshots",
                                 default=0)
    snapshot_frames: int = doc("frames of a member's training between its snapshots (its weights frozen into the "
                               "league)", range=Range(1, words="a positive number of frames"), default=100_000)
    exploiter_snapshot_frames: int = doc("frames of an exploiter's training between its snapshots, at most (with "
                                         "snapshot_win_rate, its timeout: AlphaStar's is twice the main agents' "
                                         "interval). 0: snapshot_frames", default=0)
    snapshot_win_rate: float = doc("also snapshot an exploiter early once its win rate against its slots since its "
                                    "last snapshot reaches this, over at least 100 games and population.ready_frames "
                                    "frames (AlphaStar's 0.7; a draw counts half); a main exploiter then starts "
                                    "again. Main agents keep the frame rule: they beat their frozen slots most of "
                                    "the time. 0: the frame rule only",
                                    range=Range(0, 1, words="a win rate in [0, 1] (0: off)"), default=0.0)
    keep: int = doc("snapshots each member keeps in the league (its newest; older ones leave it). Its learner "
                    "root holds them in memory, and its checkpoints save them",
                    range=Range(1, MAX_KEEP, words=f"1 to {MAX_KEEP} snapshots per member"), default=16)
    opponents: str = doc("how main agents and league exploiters weigh the snapshots when the population root "
                         "fills their slots (algo.selfplay.pool of them): 'hard' (1 - p)^2, 'variance' p(1 - p) "
                         "or 'uniform', p the member's win rate against the snapshot",
                         range=OneOf(PFSP_WEIGHTINGS), default="hard")
    payoff_decay: float = doc("decay per game of the payoff matrix's win rates (an EMA; AlphaStar's 0.99)",
                              range=Range(0, 1, below=True, words="a decay in [0, 1)"), default=0.99)
    exploiter_reset: float = doc("probability that a league exploiter starts again (restart says from what) at "
                                 "one of its snapshots (AlphaStar's 0.25)",
                                 range=Range(0, 1, words="a probability in [0, 1]"), default=0.25)
    restart: str = doc("what an exploiter starts again from after its snapshot: 'initial', the weights it was "
                       "built with, or 'main', the newest snapshot of the main agent it beats least (its weights "
                       "and normalisers, moved over MPI as a slot's at the exploiter's next report; a fresh "
                       "optimizer either way). AlphaStar's exploiters start again from a supervised agent: 'main' "
                       "is the nearest here, a player that knows the game, so a new exploiter starts even with a "
                       "strong main agent and learns what beats it", range=OneOf(RESTARTS), default="initial")

    @property
    def members(self) -> int:
        return self.main + self.main_exploiters + self.league_exploiters


@dataclass
class PopulationConfig:
    """Population-based training: members with their own hyperparameters, the worst copying the best."""

    members: int = doc("members trained side by side (0: no population, one run); the world size must be a "
                       "multiple, and each member runs the roles table on world size / members ranks", default=0)
    ready_frames: int = doc("frames a member trains (from its start, its last report, or its last copy) before "
                            "the population root judges it",
                            range=Range(1, words="a positive number of frames"), default=50_000)
    truncation: float = doc("exploit: a judged member in the bottom fraction of the population's fitness copies "
                            "the weights, optimizer state and normalisers of a member drawn from the top "
                            "fraction (at most 0.5). A member whose fitness is NaN (diverged, or no episode "
                            "ended) ranks last",
                            range=Range(0, 0.5, above=True, words="a fraction in (0, 0.5]"), default=0.25)
    explore: dict = doc("explore, after a copy: hyperparameter (a live key of the algorithm, e.g. algo.lr) -> "
                        "{perturb: [factors]} (the parent's value times one, drawn uniformly) or {resample: "
                        "[values]} (one drawn anew), optionally with low and high bounds. Empty: copies keep "
                        "the parent's hyperparameters", default_factory=dict)
    synchronous: bool = doc("judge in rounds: every member waits at each multiple of ready_frames of its own "
                             "until all have reported, and all are judged together; slower (the fastest wait for "
                             "the slowest), but a population of serial members repeats exactly for a seed, and so "
                             "does its resume. False: each member is judged when its report comes, and none waits",
                             default=False)
    values: dict = doc("each member's own start: hyperparameter -> a list of one value per member (e.g. "
                       "algo.lr: [0.001, 0.03, ...]); keys not listed take the algo section's value",
                       default_factory=dict)
    fewer_ranks: str = doc("a population resumed on fewer ranks than members (a node lost): 'pack' runs every "
                           "member, several to a rank, each taking turns of ready_frames frames in serial mode, "
                           "judged in rounds at the turns' ends, copies going through the members' checkpoints; "
                           "'pause' runs as many members as there are ranks, those of the best standing, and "
                           "keeps the others' checkpoints until a launch on more ranks. A league always pauses "
                           "(its snapshots move between members in memory)", range=OneOf(FEWER_RANKS),
                           default="pack")
    league: LeagueConfig = doc("league self-play for multi-agent games: the members' roles and snapshots (its "
                               "members are not copied onto each other)", default_factory=LeagueConfig)


def explore_rules(p: PopulationConfig) -> list[ExploreRule]:
    """The explore section as rules (validated by `validate_population`)."""
    rules = []
    for key, spec in p.explore.items():
        spec = spec or {}
        rules.append(ExploreRule(key, perturb=tuple(float(f) for f in spec.get("perturb", ())),
                                 resample=tuple(float(v) for v in spec.get("resample", ())),
                                 low=float(spec.get("low", -math.inf)), high=float(spec.get("high", math.inf))))
    return rules


def _numbers(value, where: str) -> None:
    def hint() -> str:
        return next((h for h in map(number_as_text_hint, value) if h), "") if isinstance(value, list) else ""
    check(isinstance(value, list) and value and all(is_number(v) for v in value),
          lambda: f"{where}: expected a list of finite numbers, got {shown(value)}{hint()}")


def validate_population(p: PopulationConfig, live: tuple[str, ...], algo_name: str) -> None:
    """Range checks, and every named hyperparameter a key the algorithm reads live (`live`: the
    algorithm's declaration, core/dataflow.py)."""
    if p.members == 0:
        check(not p.explore and not p.values and not p.league.members,
              "population.explore, population.values and population.league need population.members")
        return
    check(2 <= p.members <= MAX_MEMBERS, f"population.members: expected 0 (no population) or 2 to {MAX_MEMBERS:,}, "
                                         f"got {p.members}")
    check_ranges(p, "population")
    allowed = [f"algo.{k}" for k in live]

    def known(key: str, where: str) -> None:
        check(key in allowed, lambda: f"{where}: {shown(key)} is not a hyperparameter algo.name {algo_name} reads "
                                      f"live; expected one of {', '.join(allowed)}")

    for key, spec in p.explore.items():
        where = f"population.explore.{key}"
        known(key, "population.explore")
        check(isinstance(spec, dict), lambda: f"{where}: expected a mapping with perturb or resample (and optionally "
                                              f"low, high), got {shown(spec)}")
        for name in spec:
            close = difflib.get_close_matches(str(name), EXPLORE_KEYS, n=1)
            check(name in EXPLORE_KEYS, lambda: f"unknown key '{where}.{name}'"
                                                f"{f'; did you mean {close[0]!r}?' if close else ''} (valid keys here: "
                                                f"{', '.join(EXPLORE_KEYS)})")
        for name in ("perturb", "resample"):
            if name in spec:
                _numbers(spec[name], f"{where}.{name}")
        for name in ("low", "high"):
            check(name not in spec or is_number(spec[name]),
                  lambda: f"{where}.{name}: expected a finite number, got {shown(spec.get(name))}")
        try:
            explore_rules(PopulationConfig(explore={key: spec}))
        except ValueError as exc:
            raise ConfigError(f"population.explore: {exc}") from None
    for key, column in p.values.items():
        known(key, "population.values")
        _numbers(column, f"population.values.{key}")
        check(len(column) == p.members, lambda: f"population.values.{key}: expected one value per member "
                                                f"({p.members}), got {len(column)}")
    validate_league(p)


def validate_league(p: PopulationConfig) -> None:
    league = p.league
    if not league.members:
        return
    for name in ("main", "main_exploiters", "league_exploiters"):
        value = getattr(league, name)
        check(isinstance(value, int) and value >= 0, lambda: f"population.league.{name}: expected a count >= 0, "
                                                             f"got {shown(value)}")
    check_ranges(league, "population.league")
    check(league.main >= 1, f"population.league.main: a league needs at least one main agent, got {league.main}")
    check(league.members == p.members,
          f"population.league: main {league.main} + main_exploiters {league.main_exploiters} + league_exploiters "
          f"{league.league_exploiters} = {league.members} members, but population.members is {p.members}; "
          f"make them equal")
    check(not p.explore, "population.explore: a league's members are not copied onto each other, so nothing is "
                         "explored; remove it (population.values still gives each member its own start)")
    check(isinstance(league.exploiter_snapshot_frames, int) and league.exploiter_snapshot_frames >= 0,
          lambda: f"population.league.exploiter_snapshot_frames: expected a number of frames >= 0 (0: "
                  f"snapshot_frames), got {shown(league.exploiter_snapshot_frames)}")
