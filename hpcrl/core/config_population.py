"""The config section of a population (population-based training, issue 28).

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

import math
from dataclasses import dataclass

from hpcrl.core.config_base import ConfigError, check, doc, shown
from hpcrl.core.population import ExploreRule

MAX_MEMBERS = 100_000
EXPLORE_KEYS = ("perturb", "resample", "low", "high")


@dataclass
class PopulationConfig:
    """Population-based training: members with their own hyperparameters, the worst copying the best."""

    members: int = doc("members trained side by side (0: no population, one run); the world size must be a "
                       "multiple, and each member runs the roles table on world size / members ranks", default=0)
    ready_frames: int = doc("frames a member trains (from its start, its last report, or its last copy) before "
                            "the population root judges it", default=50_000)
    truncation: float = doc("exploit: a judged member in the bottom fraction of the population's fitness copies "
                            "the weights, optimizer state and normalisers of a member drawn from the top "
                            "fraction (at most 0.5). A member whose fitness is NaN (diverged, or no episode "
                            "ended) ranks last", default=0.25)
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
    def hint() -> str:  # YAML 1.1 reads 3e-5 as a string (it wants a dot: 3.0e-5)
        texts = [v for v in value if isinstance(v, str) and _is_number(_float_or_none(v))] \
            if isinstance(value, list) else []
        return f" (YAML reads {texts[0]} as text; write it with a dot, e.g. 3.0e-5)" if texts else ""
    check(isinstance(value, list) and value and all(_is_number(v) for v in value),
          lambda: f"{where}: expected a list of finite numbers, got {shown(value)}{hint()}")


def _float_or_none(text: str):
    try:
        return float(text)
    except ValueError:
        return None


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def validate_population(p: PopulationConfig, live: tuple[str, ...], algo_name: str) -> None:
    """Range checks, and every named hyperparameter a key the algorithm reads live (`live`: the
    algorithm's declaration, core/dataflow.py)."""
    if p.members == 0:
        check(not p.explore and not p.values, "population.explore and population.values need population.members")
        return
    check(2 <= p.members <= MAX_MEMBERS, f"population.members: expected 0 (no population) or 2 to {MAX_MEMBERS:,}, "
                                         f"got {p.members}")
    check(p.ready_frames >= 1, f"population.ready_frames: expected a positive number of frames, got {p.ready_frames}")
    check(0.0 < p.truncation <= 0.5, f"population.truncation: expected a fraction in (0, 0.5], got {p.truncation}")
    allowed = [f"algo.{k}" for k in live]

    def known(key: str, where: str) -> None:
        check(key in allowed, lambda: f"{where}: {shown(key)} is not a hyperparameter algo.name {algo_name} reads "
                                      f"live; expected one of {', '.join(allowed)}")

    for key, spec in p.explore.items():
        where = f"population.explore.{key}"
        known(key, "population.explore")
        check(isinstance(spec, dict) and set(spec) <= set(EXPLORE_KEYS),
              lambda: f"{where}: expected a mapping with perturb or resample (and optionally low, high), got "
                      f"{shown(spec)}")
        for name in ("perturb", "resample"):
            if name in spec:
                _numbers(spec[name], f"{where}.{name}")
        for name in ("low", "high"):
            check(name not in spec or _is_number(spec[name]),
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
