"""Self-play's anchors (algo.selfplay.anchors): fixed players that take every seat but one of a
share of games on the actor, and the learning policy's OpenSkill rating against them."""
import sys

import numpy as np
import pytest
from openskill.models import PlackettLuce

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.envs.scripted import ScriptedPlayer
from hpcrl.core.startup import find_modules_in_working_directory
from hpcrl.workers.ratings import ANCHOR_SIGMA, AnchorRating, spread
from hpcrl.workers.selfplay import Seats
from hpcrl.workers.trainer_stats import anchor_columns
from tests.conftest import mpirun, small_config, write_config


def column_five(obs, mask, rng):
    return np.full(len(mask), 5)


def column_six(obs, mask, rng):
    return np.full(len(mask), 6)


def two_actions(obs, mask, rng):
    return np.zeros(2, dtype=np.int64)


ANCHORS = "{five: 'tests.test_ratings:column_five', six: {player: 'tests.test_ratings:column_six', rating: 30}}"


def test_anchors_hold_every_seat_but_the_learning_one_and_their_games_train_nothing():
    cfg = parse_config(f"algo: {{name: ippo, selfplay: {{pool: 2, latest: 0.2, anchor_share: 0.5, "
                       f"anchors: {ANCHORS}}}}}")
    assert cfg.algo.selfplay.anchor_ratings() == {"five": 25.0, "six": 30.0}
    players = [ScriptedPlayer(spec, name) for name, spec in cfg.algo.selfplay.anchor_players().items()]
    envs, agents = 400, 2
    seats = Seats(cfg, envs, agents, np.random.default_rng(0), first_pool_id=1, anchors=players)
    anchor = seats.opponent >= 2
    assert 150 < anchor.sum() < 250 and 50 < (seats.opponent < 0).sum() < 110  # shares 0.5 and 0.2
    assert set(seats.opponent[anchor]) == {2, 3}  # both anchors drawn
    rows = seats.learning.reshape(envs, agents)
    assert not rows[anchor].any()  # an anchor's game only measures: no row of it is trained on
    assert np.all(seats.row_policy.reshape(envs, agents)[anchor] == 0)  # the policy acts for the learning seat
    actions = np.full(envs * agents, -1)
    seats.play_anchors(np.zeros((envs * agents, 3)), np.ones((envs * agents, 7), dtype=bool), actions)
    by_env = actions.reshape(envs, agents)
    learner = seats.seat
    for env in range(envs):
        other = 1 - learner[env]
        expected = {2: 5, 3: 6}.get(int(seats.opponent[env]), -1)
        assert by_env[env, other] == expected and by_env[env, learner[env]] == -1
    # judged against the anchor, for the rating; the pool's win rates (PFSP) are not the anchors'
    rewards = np.zeros(envs * agents)
    rewards[np.arange(envs) * agents + learner] = 1.0
    rewards[np.arange(envs) * agents + 1 - learner] = -1.0
    before = seats.opponent.copy()
    seats.stepped(rewards, np.ones(envs, dtype=bool))
    results = seats.take_results()
    assert results.shape == (4, 3)
    assert results[2:, 0].tolist() == [(before == 2).sum(), (before == 3).sum()] and not results[:, 1:].any()
    assert results[:2, 0].sum() == ((before >= 0) & (before < 2)).sum()
    wins_against_pool = np.bincount(before[(before >= 0) & (before < 2)], minlength=2)
    assert np.allclose(seats.payoff, [0.5 * 0.99 ** n + (1 - 0.99 ** n) for n in wins_against_pool])


def test_anchors_without_a_pool_leave_the_other_games_to_the_policy_itself():
    cfg = parse_config(f"algo: {{name: ippo, selfplay: {{latest: 0.7, anchor_share: 0.3, anchors: {ANCHORS}}}}}")
    seats = Seats(cfg, 300, 2, np.random.default_rng(1), anchors=[ScriptedPlayer(s, n) for n, s in
                                                                     cfg.algo.selfplay.anchor_players().items()])
    assert set(np.unique(seats.opponent)) == {-1, 0, 1} and 60 < (seats.opponent >= 0).sum() < 120
    assert np.all(seats.learning.reshape(300, 2)[seats.opponent < 0])


def test_a_player_that_returns_the_wrong_number_of_actions_is_named():
    player = ScriptedPlayer("tests.test_ratings:two_actions", "algo.selfplay.anchors.bad")
    with pytest.raises(ValueError, match=r"algo.selfplay.anchors.bad \(tests.test_ratings:two_actions\): "
                                         r"returned \(2,\) actions for 3 rows"):
        player.act(np.zeros((3, 4)), np.ones((3, 7), dtype=bool), np.random.default_rng(0))
    for spec, message in (("tests.nowhere:f", "cannot import module 'tests.nowhere'"),
                          ("tests.test_ratings:nothing", "module 'tests.test_ratings' has no 'nothing'"),
                          ("tests.test_ratings:ANCHORS", "'ANCHORS' in 'tests.test_ratings' is not a function")):
        with pytest.raises(ConfigError, match=message):
            ScriptedPlayer(spec, "here")


def test_a_player_is_found_in_the_working_directory_whichever_way_hpcrl_started(tmp_path, monkeypatch):
    """`python -m hpcrl` has the working directory on the Python path and the `hpcrl` console
    script does not, until its entry puts it there (last): a player module beside the user is
    found either way. test_cli runs the console script."""
    (tmp_path / "my_players.py").write_text("def first(obs, mask, rng):\n    return [0] * len(obs)\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", str(tmp_path))])
    with pytest.raises(ConfigError, match="cannot import module 'my_players'"):
        ScriptedPlayer("my_players:first", "--opponent")
    find_modules_in_working_directory()
    assert sys.path[-1] == str(tmp_path)
    player = ScriptedPlayer("my_players:first", "--opponent")
    assert player.play(np.zeros((3, 4)), None, None) == [0, 0, 0]
    find_modules_in_working_directory()  # once only
    assert sys.path.count(str(tmp_path)) == 1


def test_the_outcomes_of_a_batch_are_spread_evenly():
    assert spread(np.array([3, 0, 1])) == [0, 0, 2, 0]  # wins at 1/6, 3/6, 5/6; the loss at 1/2
    assert spread(np.array([2, 2, 0])) == [0, 1, 0, 1]
    assert spread(np.zeros(3)) == []


def test_the_rating_is_openskills_against_fixed_anchors_and_resumes_exactly():
    rating = AnchorRating({"weak": 0.0, "strong": 25.0})
    rating.add(np.array([[1, 0, 0], [0, 0, 0]]))  # one win against the weak anchor: hand-checked below
    model = PlackettLuce()
    (expected,), _ = model.rate([[model.rating()], [model.rating(mu=0.0, sigma=ANCHOR_SIGMA)]], ranks=[0, 1])
    assert rating.state().tolist() == [expected.mu, expected.sigma, 1]
    assert [(a.mu, a.sigma) for a in rating.anchors] == [(0.0, ANCHOR_SIGMA), (25.0, ANCHOR_SIGMA)]  # fixed
    for _ in range(40):  # wins 80% against the strong anchor: placed above it, with a narrowing doubt
        rating.add(np.array([[5, 0, 0], [8, 0, 2]]))
    assert 25.0 < rating.columns()["rating"] < 40.0 and rating.columns()["rating.sigma"] < 3.0
    resumed = AnchorRating({"weak": 0.0, "strong": 25.0}, rating.state())
    for r in (rating, resumed):
        r.add(np.array([[0, 0, 3], [0, 1, 4]]))
    assert resumed.columns() == rating.columns() and resumed.columns()["rating.ordinal"] < resumed.columns()["rating"]
    losing = AnchorRating({"weak": 0.0, "strong": 25.0})
    losing.add(np.array([[0, 0, 20], [0, 0, 0]]))  # losing to the weakest player ranks below it
    assert losing.columns()["rating"] < 0.0
    judged = AnchorRating({"weak": 0.0})  # a population judges it once 20 games are rated, as a mean return
    judged.add(np.array([[10, 0, 9]]))
    assert np.isnan(judged.fitness())
    judged.add(np.array([[1, 0, 0]]))
    assert judged.fitness() == judged.columns()["rating"] and judged.state()[2] == 20
    judged.reset()  # after a copy: OpenSkill's prior, nothing rated
    assert np.isnan(judged.fitness()) and judged.state().tolist() == [25.0, 25.0 / 3, 0.0]
    columns = anchor_columns(["weak", "strong"], np.array([[3, 1, 0], [0, 0, 0]]))
    assert columns["anchor.weak.games"] == 4 and columns["anchor.weak.win_rate"] == 0.75
    assert columns["anchor.weak.draw_rate"] == 0.25 and np.isnan(columns["anchor.strong.win_rate"])


@pytest.mark.parametrize("anchors, message", [
    ("{1st: 'hpcrl.envs.anchors:uniform'}", "algo.selfplay.anchors: '1st' is no anchor name"),
    ("{u: 'hpcrl.envs.anchors'}", "algo.selfplay.anchors.u: expected 'module:function'"),
    ("{u: {rating: 3}}", r"algo.selfplay.anchors.u: expected \{player: module:function, rating: MU\}"),
    ("{u: {player: 'hpcrl.envs.anchors:uniform', rating: .nan}}", "algo.selfplay.anchors.u.rating: expected a finite"),
    ("[hpcrl.envs.anchors:uniform]", "algo.selfplay.anchors: expected a mapping"),
])
def test_anchors_that_cannot_be_named_or_rated_are_refused(anchors, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(f"algo: {{name: ippo, selfplay: {{anchors: {anchors}}}}}")


def test_anchor_share_must_leave_room_and_anchors_need_a_game():
    with pytest.raises(ConfigError, match=r"algo.selfplay.anchor_share: 0.1 and latest 0.9 leave no games for the "
                                          r"pool \(latest \+ anchor_share < 1 with a pool; or set pool: 0\)"):
        parse_config(f"algo: {{name: ippo, selfplay: {{pool: 2, latest: 0.9, anchors: {ANCHORS}}}}}")
    assert parse_config(f"algo: {{name: ippo, selfplay: {{latest: 0.95, anchors: {ANCHORS}}}}}")  # no pool: latest unused
    with pytest.raises(ConfigError, match=r"algo.selfplay.anchor_share: expected a share in \(0, 1\), got 1.0"):
        parse_config(f"algo: {{name: ippo, selfplay: {{anchor_share: 1.0, anchors: {ANCHORS}}}}}")
    with pytest.raises(ConfigError, match="algo.selfplay.anchors: self-play needs a game of several agents"):
        parse_config(f"algo: {{name: ppo, selfplay: {{anchors: {ANCHORS}}}}}")


def test_a_run_whose_anchor_does_not_import_is_refused_before_it_starts(tmp_path):
    cfg = small_config(tmp_path, env={"id": "pettingzoo:classic/connect_four-v3", "num_envs": 2},
                       roles={"inference": {"ranks": 0}},
                       algo={"name": "ippo", "selfplay": {"anchors": {"lookahead": "hpcrl.envs.anchors:two_steps"}}})
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr
    assert ("algo.selfplay.anchors.lookahead: module 'hpcrl.envs.anchors' has no 'two_steps'"
            in result.stdout + result.stderr)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # nothing written
