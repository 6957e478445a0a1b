"""The pure layout function: role placement, routing, balance, node awareness."""
from collections import deque

import numpy as np
import pytest

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.layout import (FRAGMENT_BUFFERS, INLINE, batch_fragments, batch_share, fragments_per_env_rank,
                               plan_layout, sample_slots, simulated_nodes, update_frames)


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


# --- algo.batch_frames: the batch in frames, whatever the env-rank count -----------------------

def batch_job(algo: str, world_size: int, learners: int = 1, slots: str = "null"):
    """T=16 x N=4: fragments of 64 frames; one inference rank, the rest env ranks."""
    cfg = parse_config(f"env: {{num_envs: 4}}\nalgo: {{rollout_length: 16, num_minibatches: 2, {algo}}}\n"
                       f"roles: {{learner: {{ranks: {learners}, sample_slots: {slots}}}, inference: {{ranks: 1}}, "
                       f"env: {{ranks: rest}}}}")
    return cfg, plan_layout(cfg.roles, world_size)


def test_without_batch_frames_a_batch_is_one_fragment_per_env_rank_as_before():
    for mode in ("sync", "async"):
        cfg, layout = batch_job(f"mode: {mode}", 8, learners=2)  # 5 env ranks: fan-in 3 and 2
        assert list(layout.fan_in("learner")) == [3, 2] and update_frames(cfg, layout) == 5 * 64
        assert fragments_per_env_rank(cfg, layout) == 1
        assert [batch_fragments(cfg, layout, f) for f in (3, 2)] == [3, 2]
        # two per env rank; async: a batch plus two per other env rank, so one env rank alone can
        # fill a batch while the others stall holding their credits
        assert [sample_slots(cfg, layout, f) for f in (3, 2)] == ([6, 4] if mode == "sync" else [7, 4])
        assert [batch_share(cfg, layout, f) for f in (3, 2)] == [3 * 2 / 5, 2 * 2 / 5]  # by fan-in


def test_sync_batch_frames_is_a_whole_number_of_fragments_from_every_env_rank():
    cfg, layout = batch_job("mode: sync, batch_frames: 1280", 8, learners=2)  # 5 env ranks x 4 fragments
    assert fragments_per_env_rank(cfg, layout) == 4 and update_frames(cfg, layout) == 1280
    assert [batch_fragments(cfg, layout, f) for f in (3, 2)] == [12, 8]
    assert [batch_share(cfg, layout, f) for f in (3, 2)] == [3 * 2 / 5, 2 * 2 / 5]  # still by fan-in
    # a batch plus one slot per env rank, or (more than two fragments per env rank) the minimum: a batch
    # plus the FRAGMENT_BUFFERS credits each other env rank may hold once done with a version
    assert [sample_slots(cfg, layout, f) for f in (3, 2)] == [max(12 + 3, 12 + 2 * 2), max(8 + 2, 8 + 2 * 1)]
    with pytest.raises(ConfigError) as info:
        sample_slots(*batch_job("mode: sync, batch_frames: 1000", 8, learners=2), 3)
    msg = str(info.value)
    assert msg.startswith("algo.batch_frames: 1,000 frames are not a whole number of fragments per env rank")
    assert "fragments of 64 frames (algo.rollout_length 16 x env.num_envs 4)" in msg and "has 5 env ranks" in msg
    assert "a multiple of 5 x 64 = 320 (nearest: 960 or 1,280" in msg
    # the same job with 6 env ranks: whole fragments per learner, but not per env rank
    with pytest.raises(ConfigError, match="has 6 env ranks, so batch_frames must be a multiple of 6 x 64 = 384 "
                                          r"\(nearest: 1,152 or 1,536"):
        fragments_per_env_rank(*batch_job("mode: sync, batch_frames: 1280", 9, learners=2))
    with pytest.raises(ConfigError, match=r"multiple of 2 x 64 = 128 \(smallest: 128;"):
        update_frames(*batch_job("mode: sync, batch_frames: 64", 4))


def test_async_batch_frames_is_the_same_whole_number_of_fragments_for_every_learner():
    cfg, layout = batch_job("mode: async, batch_frames: 768", 8, learners=2)  # 6 fragments per learner
    assert update_frames(cfg, layout) == 768
    assert [batch_fragments(cfg, layout, f) for f in (3, 2)] == [6, 6]  # whatever the fan-in
    assert [batch_share(cfg, layout, f) for f in (3, 2)] == [1.0, 1.0]
    # a batch and two per other env rank (their credits, should they stall), not below a batch and one per env rank
    assert [sample_slots(cfg, layout, f) for f in (3, 2)] == [6 + 2 * 2, 6 + 2]
    small = batch_job("mode: async, batch_frames: 128", 8, learners=2)  # 1 fragment per learner
    assert sample_slots(*small, 3) == 6  # never below two per env rank
    with pytest.raises(ConfigError) as info:
        batch_fragments(*batch_job("mode: async, batch_frames: 700", 8, learners=2), 3)
    assert str(info.value).startswith("algo.batch_frames: 700 frames are not a whole number of fragments per "
                                      "learner: in async mode each learner's batch is batch_frames / 2 learners")
    assert "a multiple of 2 x 64 = 128 (nearest: 640 or 768)" in str(info.value)
    assert parse_config("algo: {mode: async, batch_frames: 192}").algo.batch_frames == 192
    with pytest.raises(ConfigError, match="algo.batch_frames: expected a positive number of frames or null, got 0"):
        parse_config("algo: {batch_frames: 0}")


def test_sample_slots_must_hold_a_batch_of_batch_frames():
    with pytest.raises(ConfigError, match=r"sample_slots: 5 slots cannot hold a batch of 6 fragments "
                                          r"\(algo.batch_frames 768 over 2 learners\); use at least 6 "
                                          r"\(or leave it unset for the default, 10\)"):
        sample_slots(*batch_job("mode: async, batch_frames: 768", 8, learners=2, slots="5"), 3)
    assert sample_slots(*batch_job("mode: async, batch_frames: 768", 8, learners=2, slots="6"), 3) == 6
    sync = "mode: sync, batch_frames: 256"  # 2 env ranks x 2 fragments: a batch is all the slots need
    assert sample_slots(*batch_job(sync, 4, slots="4"), 2) == 4
    with pytest.raises(ConfigError, match=r"3 slots cannot hold a batch of 4 fragments \(algo.batch_frames 256 "
                                          r"over 2 env ranks: 2 from each env rank a learner trains on, 2 here\)"):
        sample_slots(*batch_job(sync, 4, slots="3"), 2)
    with pytest.raises(ConfigError, match=r"14 slots cannot hold a batch of 12 fragments .* plus the 2 credits "
                                          r"each of the other 2 env ranks .*; use at least 16"):
        sample_slots(*batch_job("mode: sync, batch_frames: 768", 5, slots="14"), 3)  # 3 env ranks x 4


def _credit_model_deadlocks(fan_in: int, per_env_rank: int, slots: int, versions: int = 4) -> bool:
    """A model of the sample stream's credits (streams.SampleReceiver: a sender below its
    FRAGMENT_BUFFERS credits waits in a round-robin queue for a free slot; slots free only when the
    batch is trained) with sync env ranks that each send `per_env_rank` fragments per version, the
    last env rank the slowest: it sends only when no other can. True if the batch never completes."""
    credits, wanting, free = [0] * fan_in, deque(range(fan_in)), slots

    def grant():
        nonlocal free
        while free and wanting:
            sender = wanting.popleft()
            free, credits[sender] = free - 1, credits[sender] + 1
            if credits[sender] < FRAGMENT_BUFFERS:
                wanting.append(sender)

    grant()
    for _ in range(versions):
        sent = [0] * fan_in
        while sum(sent) < fan_in * per_env_rank:
            able = [s for s in range(fan_in) if credits[s] and sent[s] < per_env_rank]
            if not able:
                return True
            sender = able[0]
            sent[sender], credits[sender] = sent[sender] + 1, credits[sender] - 1
            if credits[sender] == FRAGMENT_BUFFERS - 1:
                wanting.append(sender)
            grant()
        for _ in range(sum(sent)):  # the batch is trained: its slots are released one by one
            free += 1
            grant()
    return False


@pytest.mark.parametrize("fan_in,per_env_rank", [(1, 4), (2, 1), (2, 2), (3, 2), (2, 3), (3, 3), (4, 5)])
def test_the_sync_slot_minimum_leaves_no_env_rank_without_a_credit(fan_in, per_env_rank):
    job = f"mode: sync, batch_frames: {fan_in * per_env_rank * 64}"
    with pytest.raises(ConfigError) as info:  # one slot is never enough here: the message names the minimum
        sample_slots(*batch_job(job, 2 + fan_in, slots="1"), fan_in)
    minimum = int(str(info.value).split("use at least ")[1].split(" ")[0])
    assert not _credit_model_deadlocks(fan_in, per_env_rank, minimum)
    assert not _credit_model_deadlocks(fan_in, per_env_rank, sample_slots(*batch_job(job, 2 + fan_in), fan_in))
    if minimum > fan_in * per_env_rank:  # the credits of env ranks done with a version need the extra slots
        assert _credit_model_deadlocks(fan_in, per_env_rank, minimum - 1)
