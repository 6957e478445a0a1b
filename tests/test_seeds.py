"""Seeds come from numpy's SeedSequence keyed by (run seed, purpose, index, group, env); an env's
by its global index among the run's envs."""
import numpy as np

from hpcrl.core.seeds import PURPOSES, env_seeds, seed_for


def test_no_two_envs_share_a_seed_in_a_2000_env_rank_layout_across_run_seeds_1_to_3():
    env_ranks, groups, per_group = 2_000, 2, 4  # 16,000 envs per run, 48,000 seeds in all
    seeds = [s for run_seed in (1, 2, 3) for index in range(env_ranks) for group in range(groups)
             for s in env_seeds(run_seed, (index * groups + group) * per_group, per_group)]
    assert len(seeds) == 3 * env_ranks * groups * per_group
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**64 for s in seeds)


def test_streams_of_different_purposes_ranks_and_run_seeds_differ_and_repeat():
    keys = [(run, purpose, index) for run in (1, 2) for purpose in PURPOSES for index in range(50)]
    seeds = [seed_for(*key) for key in keys]
    assert len(set(seeds)) == len(seeds)
    assert seeds == [seed_for(*key) for key in keys]  # a function of the key alone
    # the old arithmetic's overlap: seed s+1 on one rank replaying seed s on another never happens
    old_style_clash = {seed_for(1, "env", i + 100) for i in range(100)} & {seed_for(2, "env", i) for i in range(100)}
    assert not old_style_clash


def test_an_env_rank_vector_is_seeded_env_by_env():
    from hpcrl.core.config import parse_config
    from hpcrl.envs import make_vector_env
    cfg = parse_config("env: {id: CartPole-v1, num_envs: 3}").env
    a = make_vector_env(cfg, seed=env_seeds(1, 0, 3))[1]
    b = make_vector_env(cfg, seed=env_seeds(1, 0, 3))[1]
    c = make_vector_env(cfg, seed=env_seeds(1, 3, 3))[1]  # the next three envs (the rank's other group)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
