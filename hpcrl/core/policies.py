"""Which policy acts for which agent: the config's `policies` table (multi-agent runs).

`policies` maps a policy name to a regular expression on agent names, in order; an agent belongs to
the first policy whose expression matches its whole name (like SRL's index_regex). Left empty,
one policy acts for every agent (parameter sharing, MAPPO's default). One entry per team gives a
policy per team, one per agent a policy per agent. Each policy is trained by its own block of
learner ranks and published on its own parameter stream; policy servers hold every policy and
batch each request's rows by the policy of their agent.

Pure (no MPI, no torch): the config, `envs.env_spaces` and every worker read it.
"""
from __future__ import annotations

import dataclasses
import re

import numpy as np

from hpcrl.core.config_base import ConfigError

NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")  # metric columns and checkpoint groups are named after it
SHARED = "shared"  # the name of the one policy of a run without a policies table


def check_table(policies: dict) -> None:
    """Names and expressions of a `policies` table, as the config gives it (no env needed)."""
    for name, pattern in policies.items():
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise ConfigError(f"policies: policy name {name!r} must start with a letter and hold only letters, "
                              f"digits and '_' (it names metric columns and checkpoint groups)")
        if not isinstance(pattern, str):
            raise ConfigError(f"policies.{name}: expected a regular expression on agent names (a string), "
                              f"got {pattern!r}")
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ConfigError(f"policies.{name}: {pattern!r} is not a regular expression: {exc}") from None


def policy_names(policies: dict) -> list[str]:
    """The policies of a run, in policy-id order."""
    return list(policies) or [SHARED]


def agent_policies(policies: dict, agents: tuple | list) -> np.ndarray:
    """Policy id of each agent (in row order): the first policy whose expression matches the
    agent's whole name. A ConfigError names agents no policy takes and policies that take none."""
    if not policies:
        return np.zeros(len(agents), dtype=np.int64)
    if not agents:
        raise ConfigError(f"policies: {len(policies)} policies given, but the env is single-agent (a gymnasium "
                          f"env); a policies table maps PettingZoo agents, so remove it")
    compiled = [(name, re.compile(pattern)) for name, pattern in policies.items()]
    out = np.full(len(agents), -1, dtype=np.int64)
    for i, agent in enumerate(agents):
        out[i] = next((p for p, (_, rx) in enumerate(compiled) if rx.fullmatch(agent)), -1)
    if (out < 0).any():
        orphans = [a for a, p in zip(agents, out) if p < 0]
        raise ConfigError(f"policies: no policy matches agent(s) {', '.join(orphans)} (the env's agents: "
                          f"{', '.join(agents)}; the expressions must match whole names); add a policy, "
                          f"for example  rest: '.*'  as the last entry")
    idle = [name for p, (name, _) in enumerate(compiled) if not (out == p).any()]
    if idle:
        raise ConfigError(f"policies: {', '.join(idle)} match(es) no agent of the env (agents: {', '.join(agents)}; "
                          f"an agent goes to the first policy that matches it); fix the expression or remove it")
    return out


def policy_spaces(spaces, policies: dict) -> list:
    """Each policy's view of the env (hpcrl.envs.EnvSpaces): its own agents, in row order, and so
    its rows per env. A centralised critic (MAPPO) reads the agents of its own policy: the team's
    state. Without a table: the env's spaces, one policy for all."""
    ids = agent_policies(policies, spaces.agents)
    if not policies:
        return [spaces]
    return [dataclasses.replace(spaces, num_agents=int((ids == p).sum()),
                                agents=tuple(a for a, i in zip(spaces.agents, ids) if i == p))
            for p in range(len(policies))]


def row_policies(policies: dict, agents: tuple | list, envs: int) -> np.ndarray:
    """The policy id of every row of `envs` envs (env-major: an env's agents side by side)."""
    one_env = agent_policies(policies, agents) if agents or policies else np.zeros(1, dtype=np.int64)
    return np.tile(one_env, envs)


def num_policies(policies: dict) -> int:
    return max(1, len(policies))


def rows_carry_policy(cfg) -> bool:
    """Requests say each row's policy: several policies train, or a self-play pool plays some seats
    (its members are policy ids after the training ones; workers/selfplay.py)."""
    return len(cfg.policies) > 1 or cfg.algo.selfplay.pool > 0
