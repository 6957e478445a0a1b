"""A population's members as runs of their own: each member's config, derived from the
population's (core/config_population.py), and the name of its run directory."""
from __future__ import annotations

import copy
import os

import numpy as np

from hpcrl.core.config import MAX_SEED, Config, validate
from hpcrl.core.config_base import ConfigError, check
from hpcrl.core.config_population import PopulationConfig
from hpcrl.core.league import MAIN, member_roles
from hpcrl.core.population import ranking


def member_seed(cfg: Config, index: int) -> int:
    """Member `index`'s run.seed: the population's, plus its index."""
    return cfg.run.seed + index


def member_config(cfg: Config, index: int) -> Config:
    """Member `index`'s own config: a plain run (no population section) in the population's
    directory, with its seed (run.seed + index) and its values. Its config.yaml there runs the
    member alone."""
    p = cfg.population
    member = copy.deepcopy(cfg)
    member.population = PopulationConfig()
    member.run.output_dir = os.path.join(cfg.run.output_dir, cfg.run.name)
    member.run.name = member_name(index, p.members)
    seed = member_seed(cfg, index)
    check(seed <= MAX_SEED, f"run.seed: member {index} would run with seed {seed}, above {MAX_SEED}; use a smaller "
                            f"seed")
    member.run.seed = seed
    for key, column in p.values.items():
        setattr(member.algo, key.split(".", 1)[1], float(column[index]))
    if p.league.members:
        # the population root draws each member's opponents by its role (core/league.py), so its env
        # ranks draw a slot uniformly; an exploiter always plays the league, never itself
        member.algo.selfplay.opponents = "uniform"
        if member_role(cfg, index) != MAIN:
            member.algo.selfplay.latest = 0.0
    try:
        validate(member)
    except ConfigError as exc:
        raise ConfigError(f"population member {index} (population.values): {exc}") from None
    return member


def starting_values(cfg: Config, keys: tuple[str, ...]) -> np.ndarray:
    """members x keys (algo keys without 'algo.'): each member's start, from population.values
    where it lists the key, else the algo section's value (as `member_config` sets them)."""
    p = cfg.population
    return np.array([p.values.get(f"algo.{k}", [getattr(cfg.algo, k)] * p.members) for k in keys],
                    dtype=np.float64).T.reshape(p.members, len(keys))


def check_members(cfg: Config) -> None:
    """Every member's config is valid (its values in range): a ConfigError naming the member."""
    for i in range(cfg.population.members):
        member_config(cfg, i)


def member_name(index: int, members: int) -> str:
    """'member3' of 10 members, 'member03' of 100: the member's run directory inside the population's."""
    return f"member{index:0{len(str(members - 1))}d}"


def member_role(cfg: Config, index: int) -> str:
    """A league member's role (core/league.py); '' outside a league."""
    league = cfg.population.league
    if not league.members:
        return ""
    return member_roles(league.main, league.main_exploiters, league.league_exploiters)[index]


def members_to_run(standing: np.ndarray, world_size: int, in_order: bool = False,
                   complete: np.ndarray | None = None) -> list[int]:
    """The members a launch of `world_size` ranks runs, in member order: every one when they fit
    (a member runs on one rank at least: serial mode; a population has one policy). On fewer
    ranks, only members still training (`complete`: those with nothing left to do, which run
    only when none is left), as many as there are ranks: those of the best standing
    (core/population.ranking: NaN last, ties in member order), or with `in_order` (a league) the
    first ones, the main agents before the main exploiters before the league exploiters."""
    n = len(standing)
    done = np.zeros(n, dtype=bool) if complete is None else np.asarray(complete, dtype=bool)
    order = [int(m) for m in (np.arange(n) if in_order else ranking(standing)) if not done[m] or done.all()]
    return sorted(order[:min(len(order), world_size)])


def block_sizes(world_size: int, running: int) -> list[int]:
    """Each running member's ranks: the world cut into `running` consecutive blocks, as even as
    they go (the first members one more where it does not divide)."""
    return [world_size // running + (1 if i < world_size % running else 0) for i in range(running)]


def population_problem(cfg: Config, world_size: int) -> str | None:
    """What keeps the job from cutting into population.members equal blocks."""
    n = cfg.population.members
    if world_size % n == 0:
        return None
    sizes = sorted({n * (world_size // n), n * (world_size // n + 1)} - {0})  # the multiples around it
    return (f"population.members: {n} members need a world size that is a multiple of {n} (each member runs the "
            f"roles table on world size / members ranks), got {world_size}; run on "
            f"{' or '.join(f'{s:,}' for s in sizes)} ranks, or change population.members")
