"""The pure layout function: role placement, routing, balance, node awareness."""
import time

import numpy as np
import pytest

from hpcrl.config import ConfigError, parse_config
from hpcrl.layout import INLINE, plan_layout


def roles(text: str):
    return parse_config(f"roles: {text}").roles


def test_four_ranks_default_job():
    layout = plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 1}, env: {ranks: rest}}"), 4)
    assert list(layout.learners) == [0] and list(layout.inference) == [1] and list(layout.envs) == [2, 3]
    assert layout.envs_of_inference(1) == [2, 3] and layout.envs_of_learner(0) == [2, 3]
    assert layout.roles_of(0) == ("learner",) and layout.roles_of(3) == ("env",)
    assert layout.weight_subscribers() == [1]


def test_serial_mode_puts_every_role_on_rank_zero():
    layout = plan_layout(roles("{learner: {ranks: 2}, inference: {ranks: 2}, env: {ranks: 4}}"), 1)
    assert layout.serial and layout.inline_inference
    assert layout.roles_of(0) == ("learner", "env")
    assert list(layout.env_inference) == [INLINE] and layout.weight_subscribers() == []


def test_inline_inference_makes_env_ranks_subscribers():
    layout = plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 0}, env: {ranks: rest}}"), 3)
    assert layout.inline_inference and list(layout.env_inference) == [INLINE, INLINE]
    assert layout.weight_subscribers() == [1, 2]


def test_fan_in_is_balanced_over_learners_and_inference():
    layout = plan_layout(roles("{learner: {ranks: 2}, inference: {ranks: 3}, env: {ranks: rest}}"), 17)
    assert sorted(len(layout.envs_of_learner(int(r))) for r in layout.learners) == [6, 6]
    assert sorted(len(layout.envs_of_inference(int(r))) for r in layout.inference) == [4, 4, 4]


def test_env_ranks_prefer_an_inference_rank_on_their_node():
    # 2 nodes x 4 ranks; inference ranks 1 (node 0) and 2 (node 0) ... place one per node instead:
    node = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    layout = plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 2}, env: {ranks: rest}}"), 8, node)
    # inference ranks are 1 and 2, both on node 0, so node-1 env ranks fall back to least loaded
    assert all(node[int(i)] == 0 for i in layout.env_inference)
    node = np.array([0, 0, 1, 0, 0, 1, 1, 1])  # inference rank 2 lives on node 1
    layout = plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 2}, env: {ranks: rest}}"), 8, node)
    for env, inf in zip(layout.envs, layout.env_inference):
        assert node[int(env)] == node[int(inf)]


def test_world_size_mismatch_is_a_config_error():
    with pytest.raises(ConfigError, match="run with mpirun -n 4"):
        plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 1}, env: {ranks: 2}}"), 6)


def test_plans_large_worlds_quickly():
    start = time.perf_counter()
    layout = plan_layout(roles("{learner: {ranks: 64}, inference: {ranks: 512}, env: {ranks: rest}}"), 20_000)
    assert time.perf_counter() - start < 5.0  # generous: correctness check, not a benchmark
    assert len(layout.envs) == 20_000 - 576
    counts = np.bincount(layout.env_inference - 64)
    assert counts.max() - counts.min() <= 1


def test_every_learner_and_inference_rank_gets_an_env_rank():
    with pytest.raises(ConfigError, match="2 env ranks cannot feed 1 learner and 3 inference ranks"):
        plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 3}, env: {ranks: rest}}"), 6)
