"""Sizes: what a config and a layout imply for batches, sample slots and replay shards, derived
once (core/sizing.py), and the config errors of the rules behind them."""
from collections import deque

import pytest

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.layout import plan_layout
from hpcrl.core.sizing import FRAGMENT_BUFFERS, LearnerSizes, ReplayShard, Sizes


# --- algo.batch_frames: the batch in frames, whatever the env-rank count -----------------------

def batch_job(algo: str, world_size: int, learners: int = 1, slots: str = "null"):
    """T=16 x N=4: fragments of 64 frames; one inference rank, the rest env ranks."""
    cfg = parse_config(f"env: {{num_envs: 4}}\nalgo: {{rollout_length: 16, num_minibatches: 2, {algo}}}\n"
                       f"roles: {{learner: {{ranks: {learners}, sample_slots: {slots}}}, inference: {{ranks: 1}}, "
                       f"env: {{ranks: rest}}}}")
    return cfg, plan_layout(cfg.roles, world_size)


def per_learner(sizes: Sizes, key: str) -> list:
    """One size of every learner, in learner-rank order."""
    return [getattr(sizes.learner(rank), key) for rank in sorted(sizes.learners)]


def test_sizes_of_a_sync_and_an_async_layout():
    cfg, layout = batch_job("mode: sync, batch_frames: 1280", 8, learners=2)  # 5 env ranks: fan-in 3 and 2
    sizes = Sizes.of(cfg, layout)
    assert (sizes.fragment_frames, sizes.env_groups, sizes.fragments_per_version, sizes.update_frames) == (64, 2, 4, 1280)
    assert sizes.learners == {0: LearnerSizes(3, 12, 16, 6 / 5, None), 1: LearnerSizes(2, 8, 10, 4 / 5, None)}
    assert sizes.busiest is sizes.learner(0)
    cfg, layout = batch_job("mode: async, batch_frames: 768", 8, learners=2)
    sizes = Sizes.of(cfg, layout)
    assert (sizes.fragments_per_version, sizes.update_frames) == (1, 768)
    assert sizes.learners == {0: LearnerSizes(3, 6, 10, 1.0, None), 1: LearnerSizes(2, 6, 8, 1.0, None)}
    inline = parse_config("roles: {learner: {ranks: 1}, inference: {ranks: 0}, env: {ranks: rest}}")
    assert Sizes.of(inline, plan_layout(inline.roles, 3)).env_groups == 1  # nothing to hide: one group


def test_sizes_of_a_dqn_layout_hold_every_learners_replay_shard():
    two = parse_config("roles: {learner: {ranks: 2}}\nalgo: {name: dqn, replay: {capacity: 1001, warmup: 501}}")
    sizes = Sizes.of(two, plan_layout(two.roles, 8))
    assert {s.replay for s in sizes.learners.values()} == {ReplayShard(501, 251, 32)}
    assert per_learner(sizes, "sample_slots") == per_learner(sizes, "fan_in")  # a replay takes records as they come


def test_a_batch_that_does_not_fit_is_one_config_error_saying_what_would():
    with pytest.raises(ConfigError) as info:
        Sizes.of(*batch_job("mode: sync, batch_frames: 1000", 8, learners=2))
    assert str(info.value) == (
        "algo.batch_frames: 1,000 frames are not a whole number of fragments per env rank: in sync mode the batch "
        "is the same whole number of fragments of 64 frames (algo.rollout_length 16 x env.num_envs 4) from each env "
        "rank, and this job has 5 env ranks, so batch_frames must be a multiple of 5 x 64 = 320 (nearest: 960 or "
        "1,280; or use an env-rank count that divides it)")


def test_without_batch_frames_a_batch_is_one_fragment_per_env_rank_as_before():
    for mode in ("sync", "async"):
        cfg, layout = batch_job(f"mode: {mode}", 8, learners=2)  # 5 env ranks: fan-in 3 and 2
        sizes = Sizes.of(cfg, layout)
        assert list(layout.fan_in("learner")) == [3, 2] and sizes.update_frames == 5 * 64
        assert sizes.fragments_per_version == 1
        assert per_learner(sizes, "batch_fragments") == [3, 2]
        # two per env rank; async: a batch plus two per other env rank, so one env rank alone can
        # fill a batch while the others stall holding their credits
        assert per_learner(sizes, "sample_slots") == ([6, 4] if mode == "sync" else [7, 4])
        assert per_learner(sizes, "batch_share") == [3 * 2 / 5, 2 * 2 / 5]  # by fan-in


def test_sync_batch_frames_is_a_whole_number_of_fragments_from_every_env_rank():
    sizes = Sizes.of(*batch_job("mode: sync, batch_frames: 1280", 8, learners=2))  # 5 env ranks x 4 fragments
    assert sizes.fragments_per_version == 4 and sizes.update_frames == 1280
    assert per_learner(sizes, "batch_fragments") == [12, 8]
    assert per_learner(sizes, "batch_share") == [3 * 2 / 5, 2 * 2 / 5]  # still by fan-in
    # a batch plus one slot per env rank, or (more than two fragments per env rank) the minimum: a batch
    # plus the FRAGMENT_BUFFERS credits each other env rank may hold once done with a version
    assert per_learner(sizes, "sample_slots") == [max(12 + 3, 12 + 2 * 2), max(8 + 2, 8 + 2 * 1)]
    with pytest.raises(ConfigError) as info:
        Sizes.of(*batch_job("mode: sync, batch_frames: 1000", 8, learners=2))
    msg = str(info.value)
    assert msg.startswith("algo.batch_frames: 1,000 frames are not a whole number of fragments per env rank")
    assert "fragments of 64 frames (algo.rollout_length 16 x env.num_envs 4)" in msg and "has 5 env ranks" in msg
    assert "a multiple of 5 x 64 = 320 (nearest: 960 or 1,280" in msg
    # the same job with 6 env ranks: whole fragments per learner, but not per env rank
    with pytest.raises(ConfigError, match="has 6 env ranks, so batch_frames must be a multiple of 6 x 64 = 384 "
                                          r"\(nearest: 1,152 or 1,536"):
        Sizes.of(*batch_job("mode: sync, batch_frames: 1280", 9, learners=2))
    with pytest.raises(ConfigError, match=r"multiple of 2 x 64 = 128 \(smallest: 128;"):
        Sizes.of(*batch_job("mode: sync, batch_frames: 64", 4))


def test_async_batch_frames_is_the_same_whole_number_of_fragments_for_every_learner():
    sizes = Sizes.of(*batch_job("mode: async, batch_frames: 768", 8, learners=2))  # 6 fragments per learner
    assert sizes.update_frames == 768
    assert per_learner(sizes, "batch_fragments") == [6, 6]  # whatever the fan-in
    assert per_learner(sizes, "batch_share") == [1.0, 1.0]
    # a batch and two per other env rank (their credits, should they stall), not below a batch and one per env rank
    assert per_learner(sizes, "sample_slots") == [6 + 2 * 2, 6 + 2]
    small = Sizes.of(*batch_job("mode: async, batch_frames: 128", 8, learners=2))  # 1 fragment per learner
    assert small.busiest.sample_slots == 6  # never below two per env rank
    with pytest.raises(ConfigError) as info:
        Sizes.of(*batch_job("mode: async, batch_frames: 700", 8, learners=2))
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
        Sizes.of(*batch_job("mode: async, batch_frames: 768", 8, learners=2, slots="5"))
    assert Sizes.of(*batch_job("mode: async, batch_frames: 768", 8, learners=2, slots="6")).busiest.sample_slots == 6
    sync = "mode: sync, batch_frames: 256"  # 2 env ranks x 2 fragments: a batch is all the slots need
    assert Sizes.of(*batch_job(sync, 4, slots="4")).busiest.sample_slots == 4
    with pytest.raises(ConfigError, match=r"3 slots cannot hold a batch of 4 fragments \(algo.batch_frames 256 "
                                          r"over 2 env ranks: 2 from each env rank a learner trains on, 2 here\)"):
        Sizes.of(*batch_job(sync, 4, slots="3"))
    with pytest.raises(ConfigError, match=r"14 slots cannot hold a batch of 12 fragments .* plus the 2 credits "
                                          r"each of the other 2 env ranks .*; use at least 16"):
        Sizes.of(*batch_job("mode: sync, batch_frames: 768", 5, slots="14"))  # 3 env ranks x 4


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
        Sizes.of(*batch_job(job, 2 + fan_in, slots="1"))
    minimum = int(str(info.value).split("use at least ")[1].split(" ")[0])
    assert not _credit_model_deadlocks(fan_in, per_env_rank, minimum)
    assert not _credit_model_deadlocks(fan_in, per_env_rank, Sizes.of(*batch_job(job, 2 + fan_in)).busiest.sample_slots)
    if minimum > fan_in * per_env_rank:  # the credits of env ranks done with a version need the extra slots
        assert _credit_model_deadlocks(fan_in, per_env_rank, minimum - 1)
