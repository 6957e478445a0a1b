"""Several policies at once (core/policies.py): the agent-to-policy table, the learner blocks of
the layout, a policy server batching rows by policy, and two policies trained side by side on 4
ranks with their own weights, metrics columns and checkpoint groups, resumed from a checkpoint."""
import numpy as np
import pytest
import torch

from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.layout import plan_layout
from hpcrl.core.messages import fragment_spec, take_rows
from hpcrl.core.observations import Leaf, ObsLeaves
from hpcrl.core.policies import agent_policies, policy_spaces, row_policies
from hpcrl.envs import env_spaces
from hpcrl.io.checkpoint import load_latest
from hpcrl.io.metrics import read_metrics
from hpcrl.models import PolicyRunner, build_policy
from hpcrl.workers.policy_holder import PolicySet
from tests.conftest import mpirun, run_dir, small_config, write_config

RELAY = "tests.ma_envs:Relay"  # agent i is rewarded for action i % 2
AGENTS = ("red_0", "red_1", "blue_0", "blue_1", "referee")


def test_an_agent_goes_to_the_first_policy_that_matches_its_whole_name():
    teams = {"red": "red_.*", "blue": "blue_.*", "rest": ".*"}
    assert agent_policies(teams, AGENTS).tolist() == [0, 0, 1, 1, 2]
    assert agent_policies({"one": "red_0", "all": ".*"}, AGENTS).tolist() == [0, 1, 1, 1, 1]  # order decides
    assert agent_policies({}, AGENTS).tolist() == [0] * 5  # no table: one shared policy
    # rows are env-major: every env's agents side by side
    assert row_policies(teams, AGENTS, 2).tolist() == [0, 0, 1, 1, 2] * 2
    with pytest.raises(ConfigError, match="no policy matches agent.*referee.*rest: '.\\*'"):
        agent_policies({"red": "red_.*", "blue": "blue"}, AGENTS)  # 'blue' is not a whole name
    with pytest.raises(ConfigError, match="green match.* no agent"):
        agent_policies({"green": "green_.*", "all": ".*"}, AGENTS)
    with pytest.raises(ConfigError, match="single-agent"):
        agent_policies({"all": ".*"}, ())


def test_the_config_checks_policy_names_expressions_and_the_algorithm():
    ok = parse_config("algo: {name: ippo}\npolicies: {even: 'agent_[02]', odd: agent_1}")
    assert list(ok.policies) == ["even", "odd"]
    for table, message in [("{1st: a}", "must start with a letter"), ("{a.b: x}", "must start with a letter"),
                           ("{red: '[0-'}", "policies.red: '\\[0-' is not a regular expression"),
                           ("{red: 3}", "expected a regular expression")]:
        with pytest.raises(ConfigError, match=message):
            parse_config(f"algo: {{name: ippo}}\npolicies: {table}")
    with pytest.raises(ConfigError, match="algo.name ppo trains one policy"):
        parse_config("policies: {red: 'red_.*'}")


def test_each_policy_sees_its_own_agents():
    cfg = parse_config(f"env: {{id: '{RELAY}'}}\nalgo: {{name: mappo}}\npolicies: {{even: 'agent_[02]', odd: '.*'}}")
    spaces = env_spaces(cfg.env)
    even, odd = policy_spaces(spaces, cfg.policies)
    assert (even.agents, even.num_agents, odd.agents, odd.num_agents) == (("agent_0", "agent_2"), 2, ("agent_1",), 1)
    # MAPPO's critic reads its own team: (obs + one-hot) x the policy's agents
    assert build_policy(even, cfg).critic[0].in_features == (3 + 1) * 2
    assert build_policy(odd, cfg).critic[0].in_features == (3 + 1) * 1


def test_learners_split_into_one_block_per_policy_and_every_env_rank_feeds_each():
    roles = parse_config("roles: {learner: {ranks: 4}, inference: {ranks: 1}, env: {ranks: rest}}").roles
    layout = plan_layout(roles, 11, np.repeat([0, 1], [6, 5]), policies=2)
    assert layout.learners_of_policy(0).tolist() == [0, 1] and layout.learners_of_policy(1).tolist() == [2, 3]
    assert [layout.policy_of_learner(r) for r in range(4)] == [0, 0, 1, 1]
    for p in range(2):  # each env rank has one learner of each policy, the blocks' fan-in balanced
        assert set(layout.env_learners[p].tolist()) == set(layout.learners_of_policy(p).tolist())
        assert sum(len(layout.envs_of_learner(int(r))) for r in layout.learners_of_policy(p)) == len(layout.envs)
    assert sorted(layout.fan_in("learner").tolist()) == [3, 3, 3, 3]
    with pytest.raises(ConfigError, match="4 learner ranks cannot be split evenly over 3 policies.*3 or 6"):
        plan_layout(roles, 11, policies=3)
    with pytest.raises(ConfigError, match="serial mode"):
        plan_layout(roles, 1, policies=2)


def test_a_policy_record_takes_its_agents_columns_of_the_whole_fragment():
    whole = fragment_spec(3, 6, (2,), np.float32, (), np.int64, active=True).allocate()
    for f in whole.spec.fields:
        whole[f.name][...] = np.arange(whole[f.name].size).reshape(whole[f.name].shape)
    part = fragment_spec(3, 2, (2,), np.float32, (), np.int64, active=True).allocate()
    rows = np.array([1, 4])
    take_rows(whole, part, rows)
    assert np.array_equal(part["obs"], whole["obs"][:, rows]) and np.array_equal(part["active"], whole["active"][:, rows])
    assert np.array_equal(part["last_obs"], whole["last_obs"][rows])
    assert np.array_equal(part["episode_stats"], whole["episode_stats"])
    # Dict observations (a field per leaf, last_obs.* too) and a recurrent policy's fields
    layout = ObsLeaves((Leaf("pos", (2,), "float32"), Leaf("who", (), "int64", 3)))
    whole = fragment_spec(3, 6, layout, None, (), np.int64, active=True, state_size=4).allocate()
    for f in whole.spec.fields:
        whole[f.name][...] = np.arange(whole[f.name].size).reshape(whole[f.name].shape)
    part = fragment_spec(3, 2, layout, None, (), np.int64, active=True, state_size=4).allocate()
    take_rows(whole, part, rows)
    for key in ("pos", "who"):
        assert np.array_equal(part["obs"][key], whole["obs"][key][:, rows])
        assert np.array_equal(part["last_obs"][key], whole["last_obs"][key][rows])
    assert np.array_equal(part["init_state"], whole["init_state"][rows])
    assert np.array_equal(part["starts"], whole["starts"][:, rows])


def test_a_policy_server_runs_each_row_with_its_own_policy():
    cfg = parse_config(f"env: {{id: '{RELAY}'}}\nalgo: {{name: ippo}}\npolicies: {{even: 'agent_[02]', odd: '.*'}}")
    spaces = env_spaces(cfg.env)
    runners = []
    for p, own in enumerate(policy_spaces(spaces, cfg.policies)):
        torch.manual_seed(p)
        runners.append(PolicyRunner(build_policy(own, cfg), "cpu", seed=0))
    both = PolicySet(runners, weights=[None, None])
    policy = np.array([0, 1, 0] * 4, dtype=np.int16)
    obs = np.random.default_rng(0).random((12, 3)).astype(np.float32)
    out = {"actions": np.zeros(12, np.int64), "logp": np.zeros(12, np.float32), "values": np.zeros(12, np.float32)}
    both.act(obs, out, None, policy)
    for p, runner in enumerate(runners):
        rows = policy == p
        alone = {"values": np.zeros(rows.sum(), np.float32)}
        runner.value(obs[rows], alone["values"])
        assert np.allclose(out["values"][rows], alone["values"])  # each row's value is its policy's
    values = np.zeros(12, np.float32)
    both.value(obs, values, policy)
    assert np.allclose(values, out["values"])


def test_two_policies_train_side_by_side_and_resume(tmp_path):
    """Agents 0 and 2 (policy even) earn a reward for action 0; agent 1 (policy odd) observes a
    fourth number and has a third action, which alone pays it (its space differs: the others' rows
    are padded and their third action masked). Each policy learns its own constant action."""
    cfg = small_config(tmp_path, env={"id": RELAY, "num_envs": 4, "kwargs": {"wide_agent": 1, "rich_agent": 1}},
                       roles={"learner": {"ranks": 2}, "inference": {"ranks": 1}, "env": {"ranks": "rest"}},
                       algo={"name": "ippo", "mode": "sync", "rollout_length": 16, "epochs": 4, "lr": 0.003},
                       model={"hidden_sizes": [16]}, run={"total_frames": 3000},
                       policies={"even": "agent_[02]", "odd": "agent_1"})
    path = write_config(tmp_path, cfg)
    result = mpirun(4, "run", str(path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "even acts for agent_0, agent_2 (learner ranks 0); odd acts for agent_1 (learner ranks 1)" in result.stdout
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    # own columns: policy odd's one agent plays 6 steps, even's agent 2 leaves after 2 (returns <= 6 and <= 4)
    assert m["odd.return_mean"][-1] >= 5.5 and 3.5 <= m["even.return_mean"][-1] <= 4.0 + 1e-9
    assert np.all(m["even.episodes"] + m["odd.episodes"] == m["episodes"])  # the row pools every agent
    assert m["frames"].tolist() == [64 * k for k in range(1, len(m["frames"]) + 1)]  # env steps, counted once
    checkpoint, _, _ = load_latest(str(run_dir(cfg) / "checkpoint.h5"))
    spaces = policy_spaces(env_spaces(parse_config(checkpoint["config"]).env), cfg["policies"])
    even, odd = (build_policy(s, parse_config(checkpoint["config"])) for s in spaces)
    even.load_state_dict(checkpoint["model"])  # the first policy at the top, the others in /policies
    odd.load_state_dict(checkpoint["policies"]["odd"]["model"])
    observed = torch.tensor([[3.0, 0.0, 1.0, 0.0], [3.0, 1.0, 1.0, 7.0]])  # agent_0's and agent_1's view at step 3
    assert odd.mode(observed).tolist() == [2, 2]
    assert even.mode(observed, torch.tensor([[True, True, False]] * 2)).tolist() == [0, 0]
    version = int(checkpoint["counters"]["policy_version"])

    result = mpirun(4, "run", str(path), "--set", "run.total_frames=4000")
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"resuming from {run_dir(cfg) / 'checkpoint.h5'}: policy version {version}" in result.stdout
    resumed = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    after = resumed["policy_version"] > version
    assert resumed["policy_version"][after][0] == version + 1
    # the first update after the resume plays with both policies' restored weights
    assert resumed["odd.return_mean"][after][0] >= 5.5 and resumed["even.return_mean"][after][0] >= 3.5


def test_seats_give_one_learning_seat_per_game_against_the_pool_and_judge_it():
    from hpcrl.workers.selfplay import Seats
    cfg = parse_config("algo: {name: ippo, selfplay: {pool: 3, latest: 0.0}}")
    seats = Seats(cfg, envs=4, agents=2, rng=np.random.default_rng(0), first_pool_id=1)
    by_env = seats.learning.reshape(4, 2)
    assert by_env.sum(1).tolist() == [1, 1, 1, 1]  # every game against the pool: one learning seat
    policy = seats.row_policy.reshape(4, 2)
    assert np.all(policy[by_env] == 0) and np.all(policy[~by_env] == 1 + seats.opponent)  # ids after policy 0
    learner = seats.seat.copy()
    rewards = np.zeros(8)
    rewards[np.arange(4) * 2 + learner] = [1, -1, 0, 1]  # the learning seat wins, loses, draws, wins
    rewards[np.arange(4) * 2 + 1 - learner] = [-1, 1, 0, -1]
    ages = seats.opponent.copy()
    seats.stepped(rewards, np.array([True, True, True, False]))  # env 3's game goes on
    results = seats.take_results()
    expected = np.zeros((3, 3))
    for age, outcome in zip(ages[:3], (0, 2, 1)):
        expected[age, outcome] += 1
    assert np.array_equal(results, expected) and not seats.take_results().any()
    assert seats.game_return[6:].tolist() == [rewards[6], rewards[7]] and not seats.game_return[:6].any()
    mixed = Seats(parse_config("algo: {name: ippo, selfplay: {pool: 2, latest: 0.5}}"), 400, 2,
                  np.random.default_rng(1))
    assert 150 < (mixed.opponent < 0).sum() < 250  # about half the games against itself, both seats learning
    assert np.all(mixed.learning.reshape(400, 2)[mixed.opponent < 0])


def test_pfsp_draws_the_pool_ages_by_the_win_rate_each_actor_keeps():
    """algo.selfplay.opponents: the win rate against each age is an EMA of the actor's own judged
    games (decay 0.5 here, so one game moves it half way), and games against the pool draw their
    age by its PFSP weight; 'uniform' draws exactly as before the option existed."""
    from hpcrl.workers.selfplay import Seats
    cfg = parse_config("algo: {name: ippo, selfplay: {pool: 3, latest: 0.0, opponents: hard, payoff_decay: 0.5}}")
    seats = Seats(cfg, envs=3, agents=2, rng=np.random.default_rng(0), first_pool_id=1)
    assert seats.payoff.tolist() == [0.5, 0.5, 0.5]
    seats.opponent[:] = [0, 1, 2]  # one game against each age: won, drawn, lost by the learning seat
    rewards = np.zeros(6)
    rewards[np.arange(3) * 2 + seats.seat] = [1, 0, -1]
    rewards[np.arange(3) * 2 + 1 - seats.seat] = [-1, 0, 1]
    seats.stepped(rewards, np.array([True, True, True]))
    assert seats.payoff.tolist() == [0.75, 0.5, 0.25]
    seats.payoff[:] = [1.0, 1.0, 0.0]  # it always beats ages 0 and 1: 'hard' sends every game to age 2
    seats.opponent[:] = -1  # (the games now ending were against itself: nothing to judge)
    seats.stepped(np.zeros(6), np.array([True, True, True]))
    assert seats.opponent.tolist() == [2, 2, 2] and seats.row_policy.reshape(3, 2).max(1).tolist() == [3, 3, 3]
    seats.opponents = "variance"  # p(1 - p): only an age it wins half the time
    seats.payoff[:] = [1.0, 0.5, 0.0]
    seats.opponent[:] = -1
    seats.stepped(np.zeros(6), np.array([True, True, True]))
    assert seats.opponent.tolist() == [1, 1, 1]
    uniform = Seats(parse_config("algo: {name: ippo, selfplay: {pool: 3, latest: 0.5}}"), 50, 2,
                    np.random.default_rng(3))
    replay = np.random.default_rng(3)  # the draws as they were: latest, then age, then seat, per env
    expected = []
    for _ in range(50):
        age = -1 if replay.random() < 0.5 else replay.integers(3)
        replay.integers(2)
        expected.append(age)
    assert uniform.opponent.tolist() == expected
    for bad, message in (("opponents: squared", "expected one of hard, variance, uniform"),
                         ("payoff_decay: 1.0", r"expected a decay in \[0, 1\)")):
        with pytest.raises(ConfigError, match=f"algo.selfplay.{bad.split(':')[0]}: {message}"):
            parse_config(f"algo: {{name: ippo, selfplay: {{pool: 2, {bad}}}}}")


def test_a_holder_snapshots_its_policy_into_the_pool_every_few_versions():
    from hpcrl.workers.selfplay import Pool
    cfg = parse_config(f"env: {{id: '{RELAY}'}}\nalgo: {{name: ippo}}")
    spaces = env_spaces(cfg.env)

    def runner():
        return PolicyRunner(build_policy(spaces, cfg), "cpu", seed=0)
    live, pool = runner(), Pool([runner() for _ in range(3)], snapshot_every=10)
    for version in range(0, 47, 3):  # a holder that sees every third version (newest-only weights)
        with torch.no_grad():
            live.model.actor[0].bias.fill_(version)
        live.version = version
        pool.offer(live, version)
    # snapshots at the first version held at or past 0, 10, 20, 30, 40: 0, 12, 21, 30, 42
    assert [pool.runner(age).version for age in range(3)] == [42, 30, 21]
    assert pool.runner(0).model.actor[0].bias[0].item() == 42
    young = Pool([runner() for _ in range(3)], snapshot_every=10)
    young.offer(live, 5)
    assert [young.runner(age).version for age in range(3)] == [5, 5, 5]  # filling: the first snapshot


def test_self_play_against_a_pool_on_4_ranks_counts_only_the_learning_seat(tmp_path):
    """Every game against a frozen past version (latest: 0): the trainer's episodes are the learning
    seat's alone, and the win rates per pool age agree with those episodes' returns (+1 a win)."""
    cfg = small_config(tmp_path, env={"id": "pettingzoo:classic/connect_four-v3", "num_envs": 4},
                       algo={"name": "ippo", "rollout_length": 16,
                             "selfplay": {"pool": 2, "snapshot_every": 2, "latest": 0.0}},
                       model={"encoder": "mlp"}, run={"total_frames": 1280})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    games = m["selfplay.games"]
    assert games.sum() >= 10 and np.array_equal(games, m["episodes"])  # one learning seat per game
    wins, draws = m["selfplay.wins"], m["selfplay.draws"]
    rate = np.divide(wins, games, out=np.full(len(games), np.nan), where=games > 0)
    assert np.allclose(m["selfplay.win_rate"], rate, equal_nan=True)
    assert np.array_equal(m["selfplay.age0.games"] + m["selfplay.age1.games"], games)
    # connect four pays +1 / 0 / -1: the learning seats' summed return is wins - losses
    returns = np.nan_to_num(m["return_mean"]) * m["episodes"]
    assert np.allclose(returns, wins - (games - wins - draws))
