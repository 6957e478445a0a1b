"""The pure layout function: role placement, routing, balance, node awareness."""
import numpy as np
import pytest

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.layout import INLINE, plan_layout, simulated_nodes


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


def test_inference_with_a_total_count_is_spread_over_nodes_and_serves_its_own_node():
    node = simulated_nodes(8, 4)  # 2 nodes x 4 ranks
    layout = plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 2}, env: {ranks: rest}}"), 8, node)
    assert list(layout.learners) == [0] and list(layout.inference) == [1, 4]
    for env, inf in zip(layout.envs, layout.env_inference):
        assert node[env] == node[inf]
    assert list(layout.fan_in("inference")) == [2, 3]


def test_per_node_roles_take_the_lowest_ranks_of_every_node():
    node = simulated_nodes(12, 4)  # 3 nodes
    layout = plan_layout(roles("{learner: {ranks: 1}, inference: {per_node: 1}, env: {ranks: rest}}"), 12, node)
    assert list(layout.inference) == [1, 4, 8]
    assert list(layout.envs) == [2, 3, 5, 6, 7, 9, 10, 11]
    assert all(node[e] == node[i] for e, i in zip(layout.envs, layout.env_inference))
    both = plan_layout(roles("{learner: {per_node: 1}, inference: {per_node: 1}, env: {ranks: rest}}"), 12, node)
    assert list(both.learners) == [0, 4, 8] and list(both.inference) == [1, 5, 9]
    assert all(node[e] == node[l] for e, l in zip(both.envs, both.env_learner))


def test_env_ranks_on_nodes_without_a_server_fill_the_least_loaded():
    node = simulated_nodes(12, 4)
    layout = plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 2}, env: {ranks: rest}}"), 12, node)
    assert list(layout.inference) == [1, 4]  # nodes 0 and 1; node 2 has none
    assert sorted(layout.fan_in("inference")) == [4, 5]
    node2 = [i for e, i in zip(layout.envs, layout.env_inference) if node[e] == 2]
    assert len(node2) == 4 and set(node2) <= {1, 4}


def test_per_node_that_does_not_fit_is_a_config_error():
    with pytest.raises(ConfigError, match="need a world size of at least 8, but the job has 6 ranks on 2 nodes"):
        plan_layout(roles("{learner: {ranks: 1}, inference: {per_node: 3}, env: {ranks: rest}}"), 6,
                    simulated_nodes(6, 3))
    with pytest.raises(ConfigError, match="per_node: 1 inference ranks per node do not fit"):
        plan_layout(roles("{learner: {ranks: 4}, inference: {per_node: 1}, env: {ranks: rest}}"), 12,
                    simulated_nodes(12, 4))  # the 4 learners fill node 0


def test_world_size_mismatch_is_a_config_error():
    with pytest.raises(ConfigError, match="run with mpirun -n 4"):
        plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 1}, env: {ranks: 2}}"), 6)


def test_plans_a_hundred_thousand_ranks():
    node = simulated_nodes(100_000, 128)
    layout = plan_layout(roles("{learner: {ranks: 64}, inference: {per_node: 2}, env: {ranks: rest}}"), 100_000, node)
    n_nodes = 782
    assert len(layout.inference) == 2 * n_nodes and len(layout.learners) == 64
    assert len(layout.envs) == 100_000 - 64 - 2 * n_nodes
    assert np.all(node[layout.envs] == node[layout.env_inference])  # obs traffic stays on the node
    fan = layout.fan_in("inference")
    assert fan.max() == 63  # (128 - 2) / 2 on a full node; node 0 also hosts the 64 learners
    assert np.all(np.abs(np.diff(fan.reshape(-1, 2), axis=1)) <= 1)  # balanced within every node
    learner_fan = layout.fan_in("learner")
    assert learner_fan.max() - learner_fan.min() <= 1
    assert len(set(layout.learners) & set(layout.inference) | set(layout.learners) & set(layout.envs)) == 0


def test_every_learner_and_inference_rank_gets_an_env_rank():
    with pytest.raises(ConfigError, match="2 env ranks cannot feed 1 learner and 3 inference ranks"):
        plan_layout(roles("{learner: {ranks: 1}, inference: {ranks: 3}, env: {ranks: rest}}"), 6)


def test_cuda_roles_go_to_nodes_with_a_gpu():
    node = simulated_nodes(12, 4)  # node 0 has no GPU; nodes 1 and 2 have one each
    gpus = np.repeat([0, 1, 1], 4)
    layout = plan_layout(roles("{learner: {ranks: 1, device: cuda}, inference: {ranks: 2, device: cuda}, "
                               "env: {ranks: rest}}"), 12, node, gpus)
    assert list(layout.learners) == [4]  # the learner root is the lowest rank on a GPU node
    assert all(gpus[r] == 1 for r in layout.inference) and len(set(node[layout.inference])) == 2
    assert 0 in layout.envs  # CPU roles still use the GPU-less node
    with pytest.raises(ConfigError, match="5 ranks needed but only 4 suitable.*only ranks on the 1 nodes with a GPU"):
        plan_layout(roles("{learner: {ranks: 5, device: cuda}, env: {ranks: rest}}"), 24,
                    simulated_nodes(24, 4), np.repeat([0, 1, 0, 0, 0, 0], 4))
    with pytest.raises(ConfigError, match="only 2 of 3 nodes have one"):
        plan_layout(roles("{learner: {per_node: 1, device: cuda}, env: {ranks: rest}}"), 12, node, gpus)
    with pytest.raises(ConfigError, match="no node of this job has a GPU"):
        plan_layout(roles("{learner: {ranks: 1, device: cuda}, env: {ranks: rest}}"), 12, node, np.zeros(12, int))
    cpu_only = plan_layout(roles("{learner: {ranks: 1, device: cuda}, env: {ranks: rest}}"), 12, node)
    assert list(cpu_only.learners) == [0]  # without a GPU map (hpcrl plan) there is no constraint


def test_place_high_puts_a_role_on_the_highest_ranks_and_rest_cannot_be_placed():
    from hpcrl.core.config import ConfigError, parse_config
    roles = parse_config("roles: {learner: {ranks: 2, place: high}, inference: {ranks: 2}, env: {ranks: rest}}").roles
    layout = plan_layout(roles, 8, np.array([0, 0, 0, 0, 1, 1, 1, 1]))
    assert layout.learners.tolist() == [6, 7] and layout.learner_root == 6
    assert layout.inference.tolist() == [0, 4]  # round-robin over the nodes, lowest free first
    assert layout.envs.tolist() == [1, 2, 3, 5]
    per_node = parse_config("roles: {learner: {per_node: 1, place: high}, env: {ranks: rest}}").roles
    assert plan_layout(per_node, 8, np.array([0, 0, 0, 0, 1, 1, 1, 1])).learners.tolist() == [3, 7]
    with pytest.raises(ConfigError, match="roles.env.place: a role with ranks: rest takes every rank left over"):
        parse_config("roles: {env: {ranks: rest, place: high}}")
