"""The torch-free count of a policy's tensors (core/network_shapes.py, what `hpcrl plan` and
launch's memory check read) against the networks models/ builds: the same shapes, the same weights
message length, and the same ConfigError where a network cannot be built, over every algorithm,
encoder, recurrent core and kind of env, on synthetic spaces and on every job's env."""
from __future__ import annotations

import functools
import itertools
import math
from pathlib import Path

import pytest
import torch

from hpcrl.core.config import ConfigError, load_config, parse_config
from hpcrl.core.dataflow import ALGORITHMS
from hpcrl.core.network_shapes import network_shapes, policy_params
from hpcrl.core.observations import Leaf, ObsLeaves
from hpcrl.core.policies import policy_spaces
from hpcrl.envs import EnvSpaces, env_spaces
from hpcrl.models import build_policy
from hpcrl.models.runner import num_params, policy_tensors
from tests.conftest import REPO

INF = float("inf")
AGENTS = ("agent_0", "agent_1", "agent_2")
PLAYERS = ("player_0", "player_1")

# Synthetic spaces (no env is made): every observation and action kind the builders tell apart.
SPACES = {
    "flat": EnvSpaces((4,), "float32", 2),
    "flat-box-actions": EnvSpaces((3,), "float32", 0, (2,), "float32", (-1.0, -2.0), (1.0, 2.0)),
    "unbounded-box-actions": EnvSpaces((3,), "float32", 0, (2,), "float32", (-INF, -INF), (INF, INF)),
    "atari": EnvSpaces((4, 84, 84), "uint8", 6),  # the Atari preset's frame stack
    "odd-frames": EnvSpaces((3, 64, 48), "uint8", 5),
    "small-frames": EnvSpaces((3, 16, 16), "uint8", 2),  # too small for the Nature CNN
    "channel-last-frames": EnvSpaces((210, 160, 3), "uint8", 4),
    "board": EnvSpaces((6, 7, 2), "int8", 7, action_mask=True),  # connect four: a column per action
    "squares": EnvSpaces((3, 3, 2), "int8", 9, action_mask=True),  # tic-tac-toe: a cell per action
    # MiniGrid's Dict: a small image (flattened, as numbers) and an embedded direction
    "minigrid": EnvSpaces((), "structured", 7, obs_leaves=ObsLeaves((
        Leaf("image", (7, 7, 3), "uint8"), Leaf("direction", (), "int64", categories=4)))),
    # a Dict with an image leaf the Nature CNN takes, a vector, a Tuple's leaf and a scalar
    "dict-image-box-actions": EnvSpaces((), "structured", 0, (3,), "float32", (-1.0,) * 3, (1.0,) * 3,
                                        obs_leaves=ObsLeaves((Leaf("pixels", (3, 48, 40), "uint8"),
                                                              Leaf("pos", (2,), "float32"),
                                                              Leaf("pole.0", (1,), "float32"),
                                                              Leaf("speed", (), "float32")))),
    "agents": EnvSpaces((18,), "float32", 5, num_agents=3, agents=AGENTS),  # simple_spread's shape
    "agents-with-state": EnvSpaces((18 + 54,), "float32", 5, state_dim=54, num_agents=3, agents=AGENTS),
    "agents-box-actions": EnvSpaces((6,), "float32", 0, (2,), "float32", (-1.0, -1.0), (1.0, 1.0),
                                    num_agents=3, agents=AGENTS),
    "agents-dict": EnvSpaces((), "structured", 2, action_mask=True, num_agents=3, agents=AGENTS,
                             obs_leaves=ObsLeaves((Leaf("clock.step", (1,), "float32"),
                                                   Leaf("who", (), "int64", categories=3)))),
    "players-board": EnvSpaces((6, 7, 2), "int8", 7, action_mask=True, num_agents=2, agents=PLAYERS),
}

POLICIES = {"lead": "agent_0", "rest": ".*"}  # two policies of 1 and 2 agents


def algo_variants(name: str) -> list[tuple[dict, dict]]:
    """The algo keys (and policies tables) that change a network: value normalisation, the dueling
    head, the agents' sharing of a network, a policies table of a multi-agent algorithm."""
    algorithm = ALGORITHMS[name]
    if algorithm.policy == "q":
        return [({"dqn": {"dueling": d}}, {}) for d in (True, False)]
    if algorithm.mixer:  # one network shared by the agents (reading their index, or not), or one each
        return [({"team": {"shared": s, "agent_id": i}}, {}) for s, i in ((True, True), (True, False), (False, True))]
    if algorithm.replay:
        return [({}, {})]
    tables = [({"value_norm": True}, POLICIES)] if algorithm.multiagent else []
    return [({"value_norm": v}, {}) for v in (False, True)] + tables


@functools.cache
def configs() -> list:
    """Every algorithm x encoder x core x obs_norm (and grid policy head, value_norm, dueling, a
    policies table) that the config accepts, as (what was written, the config)."""
    return list(_configs())


def _configs():
    for name, encoder, core, obs_norm in itertools.product(ALGORITHMS, ("auto", "mlp", "cnn", "grid"),
                                                           ("none", "lstm", "gru"), (False, True)):
        heads = ("mlp", "columns", "landing", "cells") if encoder == "grid" and core == "none" else ("mlp",)
        for (algo, policies), head in itertools.product(algo_variants(name), heads):
            model = {"encoder": encoder, "core": core, "obs_norm": obs_norm, "hidden_sizes": [16, 8],
                     "core_size": 12, "grid_policy": head, "grid_convs": [[8, 3], [4, 3]]}
            text = {"algo": {"name": name, **algo}, "model": model, "policies": policies}
            try:
                yield text, parse_config(repr(text))
            except ConfigError:
                continue  # a combination the config refuses never reaches a builder
    # 'valid' convolutions: a map smaller than the board (the spatial heads refuse it)
    for head in ("mlp", "columns", "landing"):
        text = {"algo": {"name": "ippo"}, "model": {"encoder": "grid", "grid_policy": head,
                                                    "grid_convs": [[8, 4, "valid"]], "hidden_sizes": [16]}}
        yield text, parse_config(repr(text))


def torch_shapes(cfg, spaces) -> list:
    """Each policy's tensors as models/ builds them (on torch's meta device: nothing allocated)."""
    with torch.device("meta"):
        return [[tuple(t.shape) for t in policy_tensors(build_policy(view, cfg))]
                for view in policy_spaces(spaces, cfg.policies)]


def outcome(count, *args) -> object:
    """What `count` gives, or its ConfigError's message."""
    try:
        return count(*args)
    except ConfigError as exc:
        return f"ConfigError: {exc}"


def compare(cfg, spaces) -> str | None:
    """Where the torch-free count and the built network differ (None: nowhere)."""
    built = outcome(torch_shapes, cfg, spaces)
    counted = outcome(lambda: [network_shapes(cfg, view) for view in policy_spaces(spaces, cfg.policies)])
    if isinstance(built, str) or isinstance(counted, str):
        return None if built == counted else f"built: {built}\ncounted: {counted}"
    if [sorted(b) for b in built] != [sorted(c) for c in counted]:
        return f"shapes built: {built}\ncounted: {counted}"
    total = max(sum(math.prod(s) for s in b) for b in built)
    if policy_params(cfg, spaces) != total:
        return f"policy_params {policy_params(cfg, spaces)}, built {total}"
    return None


@pytest.mark.parametrize("kind", SPACES)
def test_the_count_without_torch_is_the_built_networks_over_every_algorithm_encoder_and_core(kind):
    spaces, tried, built, wrong = SPACES[kind], 0, 0, []
    for text, cfg in configs():
        tried += 1
        if (problem := compare(cfg, spaces)) is not None:
            wrong.append(f"{text}\n{problem}")
        built += not isinstance(outcome(policy_params, cfg, spaces), str)
    assert not wrong, f"{len(wrong)} of {tried} configs differ on {kind}; the first:\n{wrong[0]}"
    assert tried > 250 and built > 0, (tried, built)  # the matrix holds the combinations, and some build


def test_the_count_is_the_weights_message_length():
    """num_params (the weights message) of one built network, exactly, with its normalisers."""
    cfg = parse_config("algo: {name: ppo, value_norm: true}\nmodel: {obs_norm: true, hidden_sizes: [7]}")
    spaces = SPACES["flat-box-actions"]
    # actor 3-7-2, critic 3-7-1, log-std 2; obs_norm count + mean 3 + var 3, value_norm 3 scalars
    expected = (3 * 7 + 7 + 7 * 2 + 2) + (3 * 7 + 7 + 7 + 1) + 2 + (1 + 3 + 3) + 3
    assert policy_params(cfg, spaces) == expected == num_params(build_policy(spaces, cfg))


JOBS = sorted((REPO / "jobs").glob("*.yaml"))


@pytest.mark.parametrize("job", JOBS, ids=[p.stem for p in JOBS])
def test_every_jobs_policy_is_counted_as_built(job: Path):
    cfg, _ = load_config(str(job))
    spaces = env_spaces(cfg.env)
    assert compare(cfg, spaces) is None
    assert isinstance(policy_params(cfg, spaces), int)


# Real envs (made once each, as hpcrl plan makes them) with configs the jobs do not cover.
ENV_CONFIGS = [
    "env: {id: 'tests.custom_envs:DictCartPole'}\nmodel: {obs_norm: true, core: gru}",
    "env: {id: 'tests.custom_envs:DictCartPole'}\nalgo: {name: dqn}\nmodel: {core: lstm}",
    "env: {id: 'tests.custom_envs:DictCartPole'}\nmodel: {encoder: cnn}",
    "env: {id: 'minigrid:MiniGrid-DoorKey-5x5-v0'}\nalgo: {name: dqn, dqn: {dueling: false}}\nmodel: {core: lstm}",
    "env: {id: 'ALE/Breakout-v5'}\nmodel: {encoder: cnn, core: lstm}",
    "env: {id: 'ALE/Breakout-v5'}\nalgo: {name: dqn, dqn: {dueling: false}}\nmodel: {encoder: cnn}",
    "env: {id: 'Pendulum-v1'}\nalgo: {name: td3}",
    "env: {id: 'Pendulum-v1'}\nalgo: {name: dqn}",
    "env: {id: 'CartPole-v1'}\nalgo: {name: sac}",
    "env: {id: 'CartPole-v1'}\nalgo: {name: mappo}",
    "env: {id: 'mpe2:simple_spread_v3'}\nalgo: {name: mappo}\nmodel: {core: lstm}",
    "env: {id: 'mpe2:simple_spread_v3', global_state: true}\nalgo: {name: mappo}",
    "env: {id: 'mpe2:simple_spread_v3', global_state: true}\nalgo: {name: mappo}\nmodel: {core: gru}",
    "env: {id: 'mpe2:simple_spread_v3'}\nalgo: {name: mappo}\npolicies: {lead: agent_0, rest: '.*'}",
    "env: {id: 'mpe2:simple_spread_v3'}\nalgo: {name: dqn}",
    "env: {id: 'pettingzoo:classic/connect_four-v3'}\nalgo: {name: mappo}\nmodel: {encoder: grid}",
    "env: {id: 'pettingzoo:classic/connect_four-v3'}\nalgo: {name: mappo}\nmodel: {encoder: mlp}",
    "env: {id: 'pettingzoo:classic/connect_four-v3'}\nalgo: {name: ippo}\nmodel: {encoder: grid, grid_policy: columns}",
    "env: {id: 'pettingzoo:classic/connect_four-v3'}\nalgo: {name: ippo}\n"
    "model: {encoder: grid, grid_policy: landing, grid_convs: [[16, 4, valid]]}",
    "env: {id: 'pettingzoo:classic/connect_four-v3'}\nalgo: {name: ippo}\nmodel: {encoder: grid, core: lstm}",
    "env: {id: 'pettingzoo:classic/connect_four-v3'}\nalgo: {name: ippo}\n"
    "policies: {first: player_0, second: player_1}",
    "env: {id: 'tests.ma_envs:StatefulRelay'}\nalgo: {name: mappo}\npolicies: {lead: agent_0, rest: '.*'}",
    "env: {id: 'tests.ma_envs:DictRelay'}\nalgo: {name: mappo}\nmodel: {obs_norm: true}",
    "env: {id: 'tests.ma_envs:Relay', kwargs: {wide_agent: 1}}\nalgo: {name: ippo}\n"
    "policies: {a: agent_0, b: agent_1, c: agent_2}",
]


@pytest.mark.parametrize("text", ENV_CONFIGS)
def test_real_envs_policies_are_counted_as_built(text):
    cfg = parse_config(text)
    assert compare(cfg, env_spaces(cfg.env)) is None
