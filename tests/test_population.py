"""Population decisions (core/population.py) against cases worked out by hand."""
import math

import numpy as np
import pytest

from tests.conftest import REPO

from hpcrl.core.population import ExploreRule, exploit_parent, explore, pfsp_weights, ranking


class Fixed:
    """A generator stand-in that returns the given integers in turn (to check a draw by hand)."""

    def __init__(self, *values):
        self.values = list(values)

    def integers(self, n):
        value = self.values.pop(0)
        assert 0 <= value < n
        return value


def test_ranking_puts_nan_last_and_keeps_member_order_on_ties():
    assert ranking(np.array([1.0, np.nan, 3.0, 1.0, -np.inf])).tolist() == [2, 0, 3, 4, 1]


def test_exploit_copies_a_top_member_into_the_bottom_fraction_only():
    fitness = np.array([10.0, 50.0, 30.0, np.nan, 20.0, 40.0, 5.0, 60.0])
    # ranked best to worst: 7 (60), 1 (50), 5 (40), 2 (30), 4 (20), 0 (10), 6 (5), 3 (nan)
    # truncation 0.25 of 8: the top two are 7 and 1, the bottom two 6 and 3
    assert exploit_parent(3, fitness, 0.25, Fixed(0)) == 7
    assert exploit_parent(6, fitness, 0.25, Fixed(1)) == 1
    for middle in (0, 1, 2, 4, 5, 7):
        assert exploit_parent(middle, fitness, 0.25, Fixed()) is None  # no draw is made either
    # a fraction below one member still moves one; a population of one never copies
    assert exploit_parent(3, fitness, 0.1, Fixed(0)) == 7
    assert exploit_parent(0, np.array([1.0]), 0.5, Fixed()) is None
    with pytest.raises(ValueError, match="truncation"):
        exploit_parent(0, fitness, 0.6, Fixed())


def test_a_diverged_member_is_reset_from_a_good_one_even_in_a_pair():
    assert exploit_parent(1, np.array([3.0, np.nan]), 0.5, np.random.default_rng(0)) == 0
    assert exploit_parent(0, np.array([3.0, np.nan]), 0.5, np.random.default_rng(0)) is None


def test_explore_perturbs_or_resamples_each_declared_key_within_bounds():
    rules = [ExploreRule("algo.lr", perturb=(0.8, 1.2), high=1e-3),
             ExploreRule("algo.ent_coef", resample=(0.0, 0.01, 0.05)),
             ExploreRule("algo.clip_coef", perturb=(0.8, 1.2), low=0.19)]
    parent = {"algo.lr": 1e-3, "algo.ent_coef": 0.0, "algo.clip_coef": 0.2, "algo.gamma": 0.99}
    child = explore(parent, rules, Fixed(0, 2, 0))
    # lr x0.8; ent_coef the third value; clip 0.2 x 0.8 = 0.16, clipped up to 0.19; gamma untouched
    assert child == {"algo.lr": 0.8e-3, "algo.ent_coef": 0.05, "algo.clip_coef": 0.19, "algo.gamma": 0.99}
    assert explore(parent, rules, Fixed(1, 0, 1))["algo.lr"] == 1e-3  # 1.2e-3 clipped to its high bound
    assert parent["algo.lr"] == 1e-3  # the parent's own values are not changed
    with pytest.raises(KeyError, match="no such hyperparameter"):
        explore(parent, [ExploreRule("algo.tau", perturb=(2.0,))], Fixed(0))
    with pytest.raises(ValueError, match="either perturb factors or resample values"):
        ExploreRule("algo.lr")


def test_explore_draws_are_reproducible_from_the_deciders_seed():
    rules = [ExploreRule("algo.lr", perturb=(0.8, 1.25))]
    draws = [explore({"algo.lr": 1.0}, rules, np.random.default_rng(7))["algo.lr"] for _ in range(2)]
    assert draws[0] == draws[1] and draws[0] in (0.8, 1.25)


def test_pfsp_weights():
    p = np.array([0.0, 0.5, 0.9, 1.0])
    np.testing.assert_allclose(pfsp_weights(p, "hard"), np.array([1.0, 0.25, 0.01, 0.0]) / 1.26)
    np.testing.assert_allclose(pfsp_weights(p, "variance"), np.array([0.0, 0.25, 0.09, 0.0]) / 0.34)
    np.testing.assert_allclose(pfsp_weights(p, "uniform"), np.full(4, 0.25))
    np.testing.assert_allclose(pfsp_weights(np.array([1.0, 1.0]), "hard"), [0.5, 0.5])  # beats all: uniform
    assert math.isclose(pfsp_weights(np.array([0.2, 0.3, 0.7]), "variance").sum(), 1.0)
    with pytest.raises(ValueError, match="expected one of hard, variance, uniform"):
        pfsp_weights(p, "squared")


# --- the population section of the config ----------------------------------------------------

from hpcrl.core.config import ConfigError, parse_config  # noqa: E402
from hpcrl.core.members import check_members, member_config, member_name, starting_values  # noqa: E402

BASE = """
run: {name: pbt, output_dir: runs, seed: 7}
env: {id: CartPole-v1}
population:
  members: 4
  explore: {algo.lr: {perturb: [0.8, 1.25]}}
  values: {algo.lr: [0.001, 0.002, 0.003, 0.004]}
"""


def config(*overrides: str):
    return parse_config(BASE, "pbt.yaml", overrides)


def test_each_member_is_a_plain_run_of_its_own_in_the_populations_directory():
    cfg = config()
    members = [member_config(cfg, i) for i in range(4)]
    assert [m.run.seed for m in members] == [7, 8, 9, 10]
    assert [m.algo.lr for m in members] == [0.001, 0.002, 0.003, 0.004]
    assert {(m.run.output_dir, m.run.name) for m in members} == {("runs/pbt", f"member{i}") for i in range(4)}
    assert all(m.population.members == 0 for m in members)
    assert cfg.algo.lr == 3e-4 and cfg.run.seed == 7  # the population's own config is left as it was
    assert member_name(3, 10) == "member3" and member_name(3, 100) == "member03"
    # the population root's table of starting values: each member's, as its config sets them
    starts = starting_values(cfg, ("lr", "gamma"))
    assert starts.tolist() == [[m.algo.lr, m.algo.gamma] for m in members]


@pytest.mark.parametrize("override,message", [
    ("population.members=1", "population.members: expected 0 (no population) or 2 to 100,000, got 1"),
    ("population.truncation=0.6", "population.truncation: expected a fraction in (0, 0.5], got 0.6"),
    ("population.ready_frames=0", "population.ready_frames: expected a positive number of frames, got 0"),
    ("population.values={algo.lr: [0.1, 0.2]}", "population.values.algo.lr: expected one value per member (4), got 2"),
    ("population.values={algo.lr: [0.1, 0.2, 0.3, 3e-5]}",
     "(YAML reads 3e-5 as text; write it as 3.0e-5)"),
    ("population.explore={algo.epochs: {perturb: [2]}}",
     "population.explore: 'algo.epochs' is not a hyperparameter algo.name ppo reads live; expected one of algo.lr, "),
    ("population.explore={algo.lr: {perturb: [2], resample: [0.1]}}",
     "explore rule for algo.lr: give either perturb factors or resample values"),
    ("population.explore={algo.lr: {factor: [2]}}", "unknown key 'population.explore.algo.lr.factor' (valid keys "
                                                     "here: perturb, resample, low, high)"),
    ("population.explore={algo.lr: [2]}", "expected a mapping with perturb or resample"),
    ("population.explore={algo.lr: {perturb: [2], low: 1, high: 0.1}}", "low 1.0 is above high 0.1"),
    ("policies={a: 'player_0'}", "population: members train one policy each; remove the policies table"),
    ("roles.learner.device=cuda", "population: a member's state is copied from host memory"),
])
def test_the_population_section_refuses_what_cannot_run(override, message):
    with pytest.raises(ConfigError) as err:
        config(override)
    assert message in str(err.value)


def test_dqn_members_may_change_only_what_its_trainer_reads_live():
    with pytest.raises(ConfigError, match="expected one of algo.lr, algo.max_grad_norm$"):
        config("algo.name=dqn", "population.explore={algo.gamma: {perturb: [0.9]}}", "population.values={}")


def test_a_members_value_out_of_range_names_the_member():
    with pytest.raises(ConfigError, match=r"population member 2 \(population.values\): algo.lr: expected a number > 0"):
        check_members(config("population.values={algo.lr: [0.1, 0.2, -0.3, 0.4]}"))


def test_a_cancelled_exploit_voids_the_latest_of_that_member_from_that_parent():
    from hpcrl.core.population import CANCELLED, EXPLOIT, JUDGED, STOPPED, exploits_taken
    event = np.array([EXPLOIT, EXPLOIT, JUDGED, EXPLOIT, CANCELLED, STOPPED, EXPLOIT])
    member = np.array([1, 2, 0, 1, 1, 1, 2])
    parent = np.array([0, 0, -1, 0, 0, -1, 1])
    # rows 0 and 3 are both member 1 from member 0: the cancel (row 4) voids row 3, the later one
    assert exploits_taken(event, member, parent).tolist() == [0, 1, 6]


def test_a_paused_member_ranks_but_is_never_drawn_as_a_parent():
    fitness = np.array([9.0, 8.0, 1.0, 0.0])  # top half: 0 and 1; member 3 ranks last
    assert exploit_parent(3, fitness, 0.5, Fixed(0), can_send=np.array([False, True, True, True])) == 1
    assert exploit_parent(3, fitness, 0.5, Fixed(), can_send=np.array([False, False, True, True])) is None
    assert exploit_parent(0, fitness, 0.5, Fixed(), can_send=np.array([False, True, True, True])) is None


def test_standings_are_each_members_last_word_in_the_lineage():
    """A judgement's or a stop's own fitness, an exploit's parent's (the member took its state), a
    pause's kept one; a cancelled exploit says nothing; frames and hyperparameters of the last row."""
    from hpcrl.core.population import CANCELLED, EXPLOIT, JUDGED, PAUSED, START, STOPPED, standings
    lineage = {"event": np.array([START, START, START, JUDGED, EXPLOIT, CANCELLED, STOPPED, PAUSED]),
               "member": np.array([0, 1, 2, 0, 1, 1, 0, 2]),
               "frames": np.array([0, 0, 0, 256, 300, 512, 600, 0]),
               "fitness": np.array([np.nan, np.nan, np.nan, 10.0, 3.0, np.nan, 12.0, np.nan]),
               "parent_fitness": np.array([np.nan] * 4 + [10.0, 11.0, np.nan, np.nan]),
               "algo.lr": np.array([1.0, 2.0, 3.0, 1.0, 1.5, 9.0, 1.0, 3.0])}
    got = standings(lineage, 4, ("lr", "ent_coef"))
    np.testing.assert_array_equal(got.fitness, [12.0, 10.0, np.nan, np.nan])
    assert got.frames.tolist() == [600, 300, 0, 0]
    np.testing.assert_array_equal(got.hyper[:, 0], [1.0, 1.5, 3.0, np.nan])
    assert np.isnan(got.hyper[:, 1]).all()  # no such series in this lineage
    # a kill inside an append: some series a row longer, that half row not read
    torn = {key: np.append(value, 99.0) if key in ("event", "member") else value for key, value in lineage.items()}
    torn["event"][-1], torn["member"][-1] = JUDGED, 3
    again = standings(torn, 4, ("lr", "ent_coef"))
    np.testing.assert_array_equal(again.fitness, got.fitness)
    assert again.frames.tolist() == got.frames.tolist()
    assert np.isnan(standings({"event": lineage["event"]}, 4, ("lr",)).fitness).all()  # no standing to give


def test_a_launch_on_fewer_ranks_runs_the_members_of_the_best_standing_on_blocks_as_even_as_they_go():
    from hpcrl.core.members import block_sizes, members_to_run
    standing = np.array([1.0, np.nan, 5.0, 3.0, 5.0, 0.0, 2.0, 4.0])
    assert members_to_run(standing, 16) == list(range(8)) and members_to_run(standing, 8) == list(range(8))
    assert members_to_run(standing, 4) == [2, 3, 4, 7]  # ties in member order, NaN last
    assert members_to_run(np.full(3, np.nan), 2) == [0, 1]
    assert members_to_run(standing, 3, in_order=True) == [0, 1, 2]  # a league: main agents first
    complete = np.array([False, False, True, False, True, False, False, False])
    assert members_to_run(standing, 4, complete=complete) == [0, 3, 6, 7]  # only those still training
    assert members_to_run(standing, 7, complete=complete) == [0, 1, 3, 5, 6, 7]  # (on blocks of 2 and 1)
    assert members_to_run(standing, 2, in_order=True, complete=complete) == [0, 1]
    assert members_to_run(standing, 3, complete=np.ones(8, dtype=bool)) == [2, 4, 7]  # all complete: to say so
    assert block_sizes(8, 8) == [1] * 8 and block_sizes(12, 8) == [2, 2, 2, 2, 1, 1, 1, 1]
    assert block_sizes(9, 4) == [3, 2, 2, 2]
