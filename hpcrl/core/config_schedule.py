"""`algo.schedule`: steps in live hyperparameters over a run.

A run that learns well with a large entropy bonus at first and a small one later (the connect-four
league of jobs/connect_four_league.yaml) would otherwise be stopped and resumed by hand with another
value. The schedule declares those steps in the config, so one command makes the whole run.

Each step is [frames, factor]: from that many frames of the run on (a population member's own),
the key is its value times the factor. Factors rather than values, so that a schedule composes
with what else sets a value: a population's `values` and `explore` set the value the factors
scale, and lr's factors multiply `lr_schedule`'s linear decay. Piecewise constant: a run resumed
at any frame count finds the same value it had.

Pure Python, like the rest of the config: `hpcrl plan` checks it without MPI.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from hpcrl.core.config_base import FRACTION, POSITIVE, check, is_number, number_as_text_hint, shown

MAX_STEPS = 1_000  # steps per key; a schedule is read once per update, and real ones have a few


def range_of(algo: Any, key: str):
    """The range algo's field `key` declares (config.py AlgoConfig): its scaled values must keep it."""
    return next(f.metadata.get("range") for f in dataclasses.fields(algo) if f.name == key)


def validate_schedule(algo: Any, live: tuple[str, ...], algo_name: str) -> None:
    """Every key a live hyperparameter of the algorithm (its declaration, core/dataflow.py), every
    step [frames, factor] with frames rising and a factor the key's range allows."""
    schedule = algo.schedule
    check(isinstance(schedule, dict), lambda: f"algo.schedule: expected a mapping of hyperparameter -> "
                                               f"[[frames, factor], ...], got {shown(schedule)}")
    for key, steps in schedule.items():
        where = f"algo.schedule.{key}"
        check(key in live, lambda: f"algo.schedule: {shown(key)} is not a hyperparameter algo.name {algo_name} "
                                   f"reads live; expected one of {', '.join(live)}")
        check(isinstance(steps, list) and 1 <= len(steps) <= MAX_STEPS,
              lambda: f"{where}: expected a list of 1 to {MAX_STEPS:,} steps [frames, factor], got {shown(steps)}")
        last = -1
        for i, step in enumerate(steps):
            here = f"{where}[{i}]"
            check(isinstance(step, list) and len(step) == 2,
                  lambda: f"{here}: expected a step [frames, factor], e.g. [1200000, 0.2], got {shown(step)}")
            frames, factor = step
            check(isinstance(frames, int) and not isinstance(frames, bool) and frames > last,
                  lambda: f"{here}: expected a whole number of frames "
                          f"{'>= 0' if last < 0 else f'above the step before ({last:,})'}, got {shown(frames)}")
            check(is_number(factor) and factor >= 0,
                  lambda: f"{here}: expected a factor: a finite number >= 0, got {shown(factor)}"
                          f"{number_as_text_hint(factor)}")
            check(range_of(algo, key) != POSITIVE or factor > 0,
                  f"{here}: algo.{key} must stay > 0, so its factor must be > 0, got {factor}")
            value = getattr(algo, key) * factor
            check(range_of(algo, key) != FRACTION or value <= 1.0,
                  f"{here}: algo.{key} {getattr(algo, key)} x {factor} = {value:g} is above 1; algo.{key} must "
                  f"stay in [0, 1]")
            last = frames


def factors(schedule: dict, frames: int) -> dict[str, float]:
    """The factor of every scheduled key at `frames`: its last step at or before them (1 before the first)."""
    out = {}
    for key, steps in schedule.items():
        out[key] = 1.0
        for at, factor in steps:
            if at > frames:
                break
            out[key] = float(factor)
    return out


def scheduled(algo: Any, frames: int) -> Any:
    """The algo section in effect at `frames`: `algo` itself without a schedule, else a copy with each
    scheduled key scaled (lr too; the trainer sets the optimizer's from it). `algo` stays the base
    that a population reads and perturbs."""
    if not algo.schedule:
        return algo
    return dataclasses.replace(algo, **{k: getattr(algo, k) * f for k, f in factors(algo.schedule, frames).items()})
