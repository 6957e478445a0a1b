"""PettingZoo envs as agent rows (envs/multiagent.py), MAPPO's centralised critic and value
normalisation (models), and MAPPO/IPPO runs: remote inference on 4 ranks with torch-free actors,
and a short serial run that learns MPE simple_spread."""
import shutil

import numpy as np
import pytest
import torch

from hpcrl.tools.inspect import RunDirError
from tests.conftest import REPO, mpirun, run_dir, small_config, write_config
from hpcrl.core.config import ConfigError, ModelConfig, parse_config
from hpcrl.envs import EnvSpaces, make_vector_env, env_spaces
from hpcrl.envs.multiagent import ParallelVector, pettingzoo_vector
from hpcrl.io.checkpoint import load_checkpoint
from hpcrl.io.metrics import read_metrics
from hpcrl.workers.ratings import AnchorRating
from hpcrl.models import ActorCritic, build_policy

RELAY = "tests.ma_envs:Relay"
SPREAD = {"id": "mpe2:simple_spread_v3", "kwargs": {"N": 3, "max_cycles": 25, "continuous_actions": False}}


def test_agents_are_env_major_rows_with_active_masks_and_same_step_resets():
    vector = pettingzoo_vector(RELAY)({}, 2)  # 2 envs x 3 agents; agent_2 leaves after 2 steps, all end at 6
    assert type(vector) is ParallelVector
    obs, info = vector.reset(seed=[0, 1])
    assert obs.shape == (6, 3) and obs[:, 1].tolist() == [0, 1, 2, 0, 1, 2] and info["active"].all()
    actions = np.array([0, 1, 0, 0, 1, 0])
    for t in range(1, 7):
        obs, rewards, terminated, truncated, info = vector.step(actions)
        if t == 2:  # the leaver's rows end (terminated) and go inactive; the others play on
            assert terminated.tolist() == [0, 0, 1, 0, 0, 1] and info["_final_obs"].tolist() == [0, 0, 1, 0, 0, 1]
            assert info["active"].tolist() == [1, 1, 0, 1, 1, 0]
        if 2 < t < 6:  # inactive rows: zero observation and reward, never done
            assert (obs[[2, 5]] == 0).all() and rewards[[2, 5]].tolist() == [0, 0] and not terminated.any()
            assert rewards[[0, 1, 3, 4]].tolist() == [1, 1, 1, 1]
        if t == 6:  # the episode ends for those still in it, and every env restarts at once
            assert truncated.tolist() == [1, 1, 0, 1, 1, 0] and info["active"].all()
            assert [info["final_obs"][r][0] for r in (0, 1, 3, 4)] == [6, 6, 6, 6]
            assert (obs[:, 0] == 0).all()


def test_env_spaces_count_agents_and_agents_that_differ_are_padded_or_refused():
    spaces = env_spaces(parse_config(f"env: {SPREAD}".replace("'", '"')).env)
    assert spaces.num_agents == 3 and spaces.agents == ("agent_0", "agent_1", "agent_2")
    assert spaces.obs_shape == (18,) and spaces.num_actions == 5
    envs, obs = make_vector_env(parse_config(f"env: {{id: '{RELAY}', num_envs: 4}}").env, seed=0)
    assert obs.shape == (12, 3) and envs.action_mask is None
    envs.close()
    # agent 1 observes 4 numbers and has 3 actions: the others' rows are padded with a zero and
    # their third action is masked out
    cfg = parse_config(f"env: {{id: '{RELAY}', num_envs: 2, kwargs: {{wide_agent: 1, rich_agent: 1}}}}")
    spaces = env_spaces(cfg.env)
    assert spaces.obs_shape == (4,) and spaces.num_actions == 3 and spaces.action_mask
    envs, obs = make_vector_env(cfg.env, seed=0)
    assert obs[:, 3].tolist() == [0, 7, 0] * 2
    assert envs.action_mask.tolist() == [[True, True, False], [True, True, True], [True, True, False]] * 2
    envs.step(np.array([1, 2, 1] * 2))  # within each agent's own space, or Relay raises
    envs.close()
    with pytest.raises(ConfigError, match="agent_0: Box.*Discrete.*agent_1: Box.*Box.*Discrete actions"):
        env_spaces(parse_config(f"env: {{id: '{RELAY}', kwargs: {{box_agent: 1}}}}").env)


def test_algorithms_refuse_envs_of_the_wrong_kind():
    with pytest.raises(ConfigError, match="mappo trains PettingZoo envs.*use algo.name: ppo"):
        build_policy(EnvSpaces((4,), "float32", 2), parse_config("algo: {name: mappo}"))
    with pytest.raises(ConfigError, match="dqn trains single-agent envs.*mappo or ippo"):
        build_policy(EnvSpaces((3,), "float32", 2, num_agents=3, agents=("a", "b", "c")), parse_config("algo: {name: dqn}"))


def test_the_central_critic_reads_the_agents_of_its_own_env_and_its_index():
    spaces = EnvSpaces((3,), "float32", 2, num_agents=3)
    torch.manual_seed(0)
    model = ActorCritic(spaces, ModelConfig(hidden_sizes=[16]), central_critic=True)
    obs = torch.randn(6, 3)  # 2 envs x 3 agents
    with torch.no_grad():
        base = model.value(obs)
        other_agent = obs.clone()
        other_agent[1] += 1.0  # agent 1 of env 0 moves
        moved = model.value(other_agent)
    assert not torch.allclose(moved[[0, 2]], base[[0, 2]])  # its env's other agents see it
    assert torch.equal(moved[3:], base[3:])  # the other env's do not
    assert not torch.allclose(base[0], base[1])  # same env, different agents: the one-hot tells them apart
    with pytest.raises(ValueError, match="whole envs"):
        model.value(obs[:4])
    local = ActorCritic(spaces, ModelConfig(hidden_sizes=[16]))  # IPPO: each row alone
    with torch.no_grad():
        assert torch.equal(local.value(other_agent)[[0, 2]], local.value(obs)[[0, 2]])


def test_value_normalisation_learns_in_normalised_units_and_reports_returns():
    model = ActorCritic(EnvSpaces((3,), "float32", 2), ModelConfig(hidden_sizes=[8]), value_norm=True)
    returns = torch.from_numpy(np.random.default_rng(0).normal(100.0, 10.0, 4096)).float()
    model.update_value_norm(returns)
    scaled = model.raw_of(returns)
    assert abs(float(scaled.mean())) < 1e-3 and abs(float(scaled.std()) - 1.0) < 1e-3
    assert torch.allclose(model.returns_of(scaled), returns, atol=1e-3)
    with torch.no_grad():
        obs = torch.randn(5, 3)
        _, _, raw = model.evaluate(obs, torch.zeros(5, dtype=torch.int64))
        assert torch.allclose(model.value(obs), model.returns_of(raw))
    assert any(name.startswith("value_norm.") for name, _ in model.named_buffers())  # in weights and checkpoints


def test_mappo_on_4_ranks_with_remote_inference_keeps_actors_torch_free(tmp_path):
    report = tmp_path / "modules"
    report.mkdir()
    cfg = small_config(tmp_path, env={"id": RELAY, "kwargs": {"report_dir": str(report)}, "num_envs": 4},
                       algo={"name": "mappo", "rollout_length": 6}, run={"total_frames": 240})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    by_rank = {}
    for path in report.iterdir():
        by_rank.setdefault(path.name.split("-")[0], []).append(path.read_text())
    assert by_rank["rank2"] == [""] and by_rank["rank3"] == [""]  # env ranks: neither torch nor horovod
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    # a frame is an env step; each fragment (T = the episode length) ends one episode of each of 3 agents
    assert m["frames"].tolist() == [48 * k for k in range(1, 6)]
    assert m["episodes"].tolist() == [2 * 4 * 3] * 5
    # agents 0 and 1 can earn 6 a game, the leaver 2: the mean return is bounded by 14 / 3
    assert np.all(m["return_max"] <= 6) and np.all(m["return_mean"] <= 14 / 3 + 1e-9)


@pytest.mark.learning
def test_mappo_learns_simple_spread_serially(tmp_path):
    """Seeded serial MAPPO: 12k env steps raise the per-agent return from about -28 (a random
    policy) by several units; IPPO runs the same config."""
    cfg = small_config(tmp_path, env={**SPREAD, "num_envs": 8}, roles={"inference": {"ranks": 0}},
                       algo={"name": "mappo", "rollout_length": 25, "epochs": 10, "num_minibatches": 1,
                             "lr": 0.0007, "ent_coef": 0.01, "max_grad_norm": 10.0},
                       model={"hidden_sizes": [64, 64], "activation": "relu"}, run={"total_frames": 12000})
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert m["frames"][-1] == 12000 and m["episodes"].tolist() == [8 * 3] * 60
    assert np.mean(m["return_mean"][-10:]) > np.mean(m["return_mean"][:5]) + 3
    ippo = mpirun(1, "run", str(write_config(tmp_path, cfg)), "--set", "algo.name=ippo", "--set", "run.name=ippo",
                  "--set", "run.total_frames=1000")
    assert ippo.returncode == 0, ippo.stdout + ippo.stderr


def test_masks_never_let_an_invalid_action_through():
    """A property over random masks (any number of valid actions, some rows with none): sampling
    draws only valid actions, their probabilities sum to 1 over the valid ones, the argmax is valid,
    and rows with no valid action keep every action rather than producing NaN."""
    torch.manual_seed(0)
    model = ActorCritic(EnvSpaces((3,), "float32", 7), ModelConfig(hidden_sizes=[16]))
    rng = np.random.default_rng(1)
    generator = torch.Generator().manual_seed(2)
    for _ in range(200):
        obs = torch.from_numpy(rng.normal(0, 3, (32, 3)).astype(np.float32))
        mask = torch.from_numpy(rng.random((32, 7)) < rng.uniform(0.05, 0.9))
        with torch.no_grad():
            actions, logp, _ = model.sample(obs, generator, mask)
            probs = model.log_probs(obs, mask).exp()
            _, entropy, _ = model.evaluate(obs, actions, mask)
        some = mask.any(-1)
        assert mask[some][torch.arange(int(some.sum())), actions[some]].all()
        assert torch.all(probs[some][~mask[some]] == 0)
        assert torch.allclose(probs.sum(-1), torch.ones(32)) and torch.isfinite(logp).all()
        assert torch.isfinite(entropy).all()
        assert mask[some][torch.arange(int(some.sum())), model.mode(obs, mask)[some]].all()


@pytest.mark.parametrize("mask_in_info", [False, True], ids=["observation_dict", "infos"])
def test_masked_agents_on_4_ranks_never_take_an_invalid_action(tmp_path, mask_in_info):
    """MaskedRelay raises on an invalid action: the run finishing proves none got through, from
    the policy server (sync MAPPO here) to the env; async IPPO masks on the inline path too."""
    envs, _ = make_vector_env(parse_config(f"env: {{id: 'tests.ma_envs:MaskedRelay', num_envs: 2, kwargs: "
                                           f"{{mask_in_info: {str(mask_in_info).lower()}}}}}").env, seed=0)
    assert envs.unwrapped.action_mask.shape == (6, 3)
    envs.close()
    cfg = small_config(tmp_path, env={"id": "tests.ma_envs:MaskedRelay", "kwargs": {"mask_in_info": mask_in_info}},
                       algo={"name": "mappo", "rollout_length": 6}, run={"total_frames": 240})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    inline = mpirun(3, "run", str(write_config(tmp_path, cfg)), "--set", "algo.name=ippo", "--set", "algo.mode=async",
                    "--set", "roles.inference.ranks=0", "--set", "run.name=inline")
    assert inline.returncode == 0, inline.stdout + inline.stderr


def test_serial_mappo_resume_continues_exactly_with_masks_and_value_norm(tmp_path):
    """The checkpoint holds what a multi-agent resume needs: the value normaliser (model buffers),
    and in serial mode the envs, their active rows and their action masks."""
    def config(name: str, frames: int) -> dict:
        return small_config(tmp_path, name=name, env={"id": "tests.ma_envs:MaskedRelay", "num_envs": 4},
                            algo={"name": "mappo", "rollout_length": 6, "lr_schedule": "constant"},
                            roles={"inference": {"ranks": 0}}, run={"total_frames": frames})
    whole = config("whole", 240)
    assert mpirun(1, "run", str(write_config(tmp_path, whole, "whole.yaml"))).returncode == 0
    path = str(write_config(tmp_path, config("halves", 120), "halves.yaml"))
    assert mpirun(1, "run", path).returncode == 0
    second = mpirun(1, "run", path, "--set", "run.total_frames=240")
    assert second.returncode == 0 and "resuming from" in second.stdout, second.stdout + second.stderr
    a = read_metrics(str(run_dir(whole) / "metrics.h5"))
    b = read_metrics(str(run_dir(config("halves", 120)) / "metrics.h5"))
    assert len(a["frames"]) == 10
    for key in ("frames", "episodes", "return_mean", "loss_policy", "loss_value", "entropy"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)  # bit-identical, row for row


def test_eval_plays_a_multiagent_run_under_its_masks(tmp_path):
    """hpcrl eval on a MAPPO run of MaskedRelay (which raises on an invalid action): games end when
    the env does, and a game's return is the mean over its agents (6 steps; the leaver plays 2)."""
    cfg = small_config(tmp_path, env={"id": "tests.ma_envs:MaskedRelay", "num_envs": 2},
                       algo={"name": "mappo", "rollout_length": 6}, roles={"inference": {"ranks": 0}},
                       run={"total_frames": 48})
    assert mpirun(1, "run", str(write_config(tmp_path, cfg))).returncode == 0
    from hpcrl.tools.evaluate import evaluate
    result = evaluate(str(run_dir(cfg)), episodes=3, trust_code=True)  # tests.ma_envs: our own code
    assert result.lengths == [6, 6, 6]
    assert all(0 <= r <= 14 / 3 + 1e-9 for r in result.returns)


def test_turn_based_games_are_rows_that_take_turns_and_share_each_outcome():
    """PettingZoo's classic connect_four_v3 (an AEC env): one move per vector step by the player
    whose turn it is, the other row sitting out with its own view of the board; the last move's
    outcome reaches both players' rows (+1 and -1, never an illegal-move -1 alone), and every env
    restarts at once."""
    vector = make_vector_env(parse_config("env: {id: 'pettingzoo:classic/connect_four-v3', num_envs: 3}").env,
                             seed=[4, 5, 6])[0].unwrapped
    rng = np.random.default_rng(0)
    assert vector.active.tolist() == [True, False] * 3
    games, moves = 0, np.zeros(3, int)
    for _ in range(300):
        mask, before = vector.action_mask, vector.active
        actions = np.array([rng.choice(np.flatnonzero(m)) for m in mask])
        obs, rewards, terminated, truncated, info = vector.step(actions)
        moves += 1
        for e in range(3):
            rows = slice(2 * e, 2 * e + 2)
            if info["env_done"][e]:
                assert rewards[rows].sum() == 0 and terminated[rows].all()  # +1/-1 or a draw: all moves legal
                assert info["active"][rows].tolist() == [True, False] and moves[e] >= 7
                games, moves[e] = games + 1, 0
            else:
                assert rewards[rows].tolist() == [0, 0] and info["active"][rows].tolist() == before[rows][::-1].tolist()
    assert games >= 10
    assert obs.shape == (6, 6, 7, 2)  # both players see the board, each from its own side


def test_self_play_on_connect_four_runs_on_4_ranks_under_masks(tmp_path):
    """A shared policy playing both sides of connect four through a policy server: every move legal
    (PettingZoo ends a game with an illegal move as a -1 for its maker alone, which the zero-sum
    returns would show), and each game counted once per player."""
    cfg = small_config(tmp_path, env={"id": "pettingzoo:classic/connect_four-v3", "num_envs": 4},
                       algo={"name": "ippo", "rollout_length": 16}, model={"encoder": "mlp"},
                       run={"total_frames": 640})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    games = m["episodes"].sum() / 2
    assert games >= 10 and m["episodes"].sum() % 2 == 0
    assert np.nansum(m["return_mean"] * m["episodes"]) == 0  # zero-sum: every win is a loss for the other side


@pytest.mark.learning
def test_self_play_raises_the_win_rate_against_random_and_an_early_snapshot(tmp_path):
    """The shipped connect four job, serially: its policy after 2k moves of self-play (a frozen early
    snapshot) and after 30k, each played by hpcrl eval in both seats for 200 games. A quarter of the
    job's games are against its pool of past versions, which it beats more often than not."""
    path = str(REPO / "jobs/connect_four_selfplay.yaml")
    common = ("--set", f"run.output_dir={tmp_path}", "--set", "roles.inference.ranks=0")
    first = mpirun(1, "run", path, *common, "--set", "run.total_frames=2048")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "cannot be saved as data" not in first.stdout  # the games are data (envs/state.py): saved whole
    shutil.copytree(tmp_path / "connect_four_selfplay", tmp_path / "early")
    resumed = mpirun(1, "run", path, *common, "--set", "run.total_frames=30000")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    # the games, the seats' draws and their win rates per pool age continue from the checkpoint
    assert "resuming from" in resumed.stdout and "env state was not restored" not in resumed.stdout
    from hpcrl.tools.evaluate import evaluate
    # 200 games each (a win rate's standard error about 0.035): the policy after 30k moves won 0.82
    # of 100 on one machine, 0.72 of 200 on another (torch's kernels differ by CPU: so does training)
    early = evaluate(str(tmp_path / "early"), 200, opponent="random").summary()["win_rate"]
    late = evaluate(str(tmp_path / "connect_four_selfplay"), 200, opponent="random").summary()["win_rate"]
    versus_early = evaluate(str(tmp_path / "connect_four_selfplay"), 200, opponent=str(tmp_path / "early"))
    assert late >= early + 0.1 and late >= 0.65, (early, late)
    assert versus_early.summary()["win_rate"] >= 0.65
    # the fixed anchor a league is rated against (hpcrl/envs/anchors.py, a scripted --opponent) beats the
    # early snapshot nearly always: an untrained policy is about as good as a uniform player
    seen = []  # every step, as `watch` sees it: one row of two moves, the run's seat alternating by game
    anchored = evaluate(str(tmp_path / "early"), 50, opponent="hpcrl.envs.anchors:one_step_lookahead",
                        watch=lambda game, seat, rows, mask, actions, active: seen.append(
                            (game, seat, active.copy(), mask[active].sum())))
    assert len(seen) == sum(anchored.lengths) and [g for g, *_ in seen] == sorted(g for g, *_ in seen)
    assert all(seat == game % 2 and active.sum() == 1 for game, seat, active, _ in seen)
    assert [n for *_, n in seen[:2]] == [7, 7]  # the first two moves of the first game: every column open
    anchored = anchored.summary()
    assert anchored["wins"] + anchored["draws"] + anchored["losses"] == 50 and anchored["win_rate"] <= 0.25, anchored
    m = read_metrics(str(tmp_path / "connect_four_selfplay" / "metrics.h5"))
    assert m["selfplay.games"].sum() >= 200 and m["selfplay.wins"].sum() > 0.5 * m["selfplay.games"].sum()
    # the anchors measured it all along (untrained games), and its rating rose and continued from
    # the early checkpoint's: the first resumed update's games, rated from there, give its row
    assert m["anchor.uniform.games"].sum() >= 50 and m["anchor.one_step.games"].sum() >= 50
    assert m["rating"][-20:].mean() > m["rating"][0] + 2.0, (m["rating"][0], m["rating"][-20:])  # (about 23 -> 28)
    early_frames = read_metrics(str(tmp_path / "early" / "metrics.h5"))["frames"][-1]
    first = int(np.flatnonzero(m["frames"] > early_frames)[0])
    saved = load_checkpoint(str(tmp_path / "early" / "checkpoint.h5"))["parts"]["stats"]["rating"]
    rating = AnchorRating(parse_config(open(path).read()).algo.selfplay.anchor_ratings(), saved)
    games = []
    for anchor in ("uniform", "one_step"):
        played = m[f"anchor.{anchor}.games"][first]
        wins, draws = (round(np.nan_to_num(m[f"anchor.{anchor}.{r}_rate"][first]) * played) for r in ("win", "draw"))
        games.append([wins, draws, played - wins - draws])
    rating.add(np.array(games))
    assert rating.columns()["rating"] == m["rating"][first]
    # hpcrl inspect reports the rating and the latest 100+ games against each anchor; plot draws the rating
    from hpcrl.tools.inspect import describe, format_report
    from hpcrl.tools.plot import load_curve
    report = format_report(describe(str(tmp_path / "connect_four_selfplay")))
    rows = int(np.searchsorted(np.cumsum(m["anchor.one_step.games"][::-1]), 100)) + 1
    won = np.nansum((m["anchor.one_step.win_rate"] * m["anchor.one_step.games"])[-rows:])
    assert f"rating {m['rating'][-1]:.1f} +- {m['rating.sigma'][-1]:.1f} against the anchors; latest games won: " \
           f"one_step {won / m['anchor.one_step.games'][-rows:].sum():.2f} of {m['anchor.one_step.games'][-rows:].sum()}" in report
    assert load_curve(str(tmp_path / "connect_four_selfplay")).metric == "rating"
    solo = small_config(tmp_path, name="solo", roles={"inference": {"ranks": 0}}, run={"total_frames": 128})
    assert mpirun(1, "run", str(write_config(tmp_path, solo, "solo.yaml"))).returncode == 0
    with pytest.raises(RunDirError, match="has one agent; an opponent needs a multi-agent game"):
        evaluate(str(run_dir(solo)), 1, opponent="random")
    from hpcrl.tools.plot import plot_runs  # one series for all: the rated run's rating, which solo lacks
    with pytest.raises(RunDirError, match="'.*solo': metrics.h5 has no series 'rating'"):
        plot_runs([str(tmp_path / "connect_four_selfplay"), str(run_dir(solo))], str(tmp_path / "both.png"))


def test_single_agent_envs_that_give_masks_in_info_act_and_learn_under_them(tmp_path):
    """tests.custom_envs:MaskedKeys raises on an invalid key: a run that ends cleanly never took one.
    A random valid key earns about 8/3 an episode, the best valid key every time 8."""
    spaces = env_spaces(parse_config("env: {id: 'tests.custom_envs:MaskedKeys'}").env)
    assert spaces.action_mask and spaces.num_actions == 6 and not spaces.multiagent
    with pytest.raises(ConfigError, match="gives info\\['action_mask'\\] of 5 entries for action space Discrete\\(6\\)"):
        env_spaces(parse_config("env: {id: 'tests.custom_envs:MaskedKeys', kwargs: {width: 5}}").env)
    cfg = small_config(tmp_path, env={"id": "tests.custom_envs:MaskedKeys", "num_envs": 4},
                       algo={"rollout_length": 16, "epochs": 4, "lr": 0.003}, model={"hidden_sizes": [32]},
                       run={"total_frames": 4096})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert m["return_mean"][0] < 5 and m["return_mean"][-1] >= 7


def test_a_centralised_critic_reads_the_env_state_that_ends_each_row_and_the_policy_never_does():
    cfg = parse_config("env: {id: 'tests.ma_envs:StatefulRelay', num_envs: 2}\nalgo: {name: mappo}")
    assert cfg.env.global_state  # resolved: mappo reads the state where the env has one
    spaces = env_spaces(cfg.env)
    assert spaces.obs_shape == (3 + 2,) and spaces.state_dim == 2
    envs, obs = make_vector_env(cfg.env, seed=0)
    assert obs[:, 3:].tolist() == [[0, 3]] * 6  # every row of every env: step 0, 3 agents in
    obs = envs.step(np.zeros(6, dtype=np.int64))[0]
    obs = envs.step(np.zeros(6, dtype=np.int64))[0]
    assert obs[:, 3:].tolist() == [[2, 2]] * 6  # agent 2 left at step 2
    model = build_policy(spaces, cfg)
    assert model.actor[0].in_features == 3 and model.critic[0].in_features == 2 + 3
    x = torch.as_tensor(obs)
    other = x.clone()
    other[:, 3:] = 50.0
    assert torch.equal(model.log_probs(x), model.log_probs(other))  # the policy never reads the state
    assert not torch.allclose(model.value(x), model.value(other))
    assert torch.equal(model.critic_input(x)[:, :2], x[:, 3:])
    plain = env_spaces(parse_config("env: {id: 'tests.ma_envs:Relay'}\nalgo: {name: mappo}").env)
    assert plain.state_dim == 0 and plain.obs_shape == (3,)  # no state(): the agents' observations
    with pytest.raises(ConfigError, match="env.global_state: the env's state is read by a centralised critic"):
        parse_config("env: {id: 'tests.ma_envs:StatefulRelay', global_state: true}\nalgo: {name: ippo}")


@pytest.mark.parametrize("case", ["mappo-lstm", "selfplay-gru"])
def test_recurrent_multiagent_runs_through_a_policy_server_and_plays_in_eval(tmp_path, case):
    """A recurrent core with agent rows on 4 ranks: MAPPO on simple_spread (the server keeps each
    agent's state, the central critic reads whole envs), and IPPO self-play on connect four against
    a pool drawn by PFSP (turn-based rows under masks, pool members acting from the same rows' states)
    and an anchor the env ranks play themselves; then
    `hpcrl eval` plays the result with its state."""
    if case == "mappo-lstm":
        cfg = small_config(tmp_path, env={**SPREAD, "num_envs": 4}, algo={"name": "mappo", "rollout_length": 25},
                           model={"core": "lstm", "core_size": 16}, run={"total_frames": 1200})
    else:
        cfg = small_config(tmp_path, env={"id": "pettingzoo:classic/connect_four-v3", "num_envs": 4},
                           algo={"name": "ippo", "rollout_length": 16, "mode": "async",
                                 "selfplay": {"pool": 2, "snapshot_every": 2, "latest": 0.5, "opponents": "hard",
                                              "anchors": {"uniform": "hpcrl.envs.anchors:uniform"},
                                              "anchor_share": 0.25}},
                           model={"encoder": "mlp", "core": "gru", "core_size": 16}, run={"total_frames": 1280})
    result = mpirun(4, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    assert m["frames"][-1] >= cfg["run"]["total_frames"] and m["episodes"].sum() > 0
    if case == "selfplay-gru":  # games against the pool and the anchor (played on the env ranks) were judged
        assert m["selfplay.games"].sum() > 0 and m["anchor.uniform.games"].sum() > 0
        assert np.isfinite(m["rating"]).all() and m["rating.sigma"][-1] < 25.0 / 3  # rated: below the prior's doubt
    played = mpirun(1, "eval", str(run_dir(cfg)), "--episodes", "2")
    assert played.returncode == 0 and "2 episodes" in played.stdout, played.stdout + played.stderr


def test_agents_with_dict_observations_learn_from_their_leaves_and_run_on_a_policy_server(tmp_path):
    """PettingZoo agents observing a nested dict beside their action mask (tests.ma_envs:DictRelay):
    rows of each leaf, the text left out. Only the Discrete "who" leaf (embedded) tells an agent
    its rewarded action, so a policy that earns nearly every reward has read it; MAPPO's critic
    reads every agent's encoded leaves. Then IPPO with a GRU on 3 ranks through a policy server."""
    env = {"id": "tests.ma_envs:DictRelay", "num_envs": 4}
    cfg = small_config(tmp_path, env=env, roles={"inference": {"ranks": 0}},
                       algo={"name": "mappo", "rollout_length": 6, "lr": 0.003, "num_minibatches": 1},
                       run={"total_frames": 1200})
    result = mpirun(1, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "observation keys note are text" in result.stderr
    m = read_metrics(str(run_dir(cfg) / "metrics.h5"))
    # agents 0 and 1 can earn 6 a game, the leaver 2 (a random policy: about half of that)
    assert np.mean(m["return_mean"][:3]) < 3.5 and np.mean(m["return_mean"][-5:]) > 4.5
    gru = mpirun(3, "run", str(write_config(tmp_path, cfg)), "--set", "algo.name=ippo", "--set", "run.name=gru",
                 "--set", "roles.inference.ranks=1",
                 "--set", "model.core=gru", "--set", "model.core_size=8", "--set", "run.total_frames=720")
    assert gru.returncode == 0, gru.stdout + gru.stderr
    played = mpirun(1, "eval", str(tmp_path / "runs" / "gru"), "--episodes", "2", "--trust-env-code")
    assert played.returncode == 0 and "2 episodes" in played.stdout, played.stdout + played.stderr


def test_several_recurrent_policies_train_and_play_in_eval_each_with_its_own_state(tmp_path):
    """Two policies with a GRU each (agents 0 and 2, and agent 1) on 3 ranks with inline inference;
    `hpcrl eval` keeps a state per policy for its own rows, sampled and greedy."""
    cfg = small_config(tmp_path, env={"id": RELAY, "num_envs": 2}, roles={"learner": {"ranks": 2},
                                                                          "inference": {"ranks": 0}},
                       algo={"name": "ippo", "rollout_length": 6}, model={"core": "gru", "core_size": 8},
                       run={"total_frames": 240})
    cfg["policies"] = {"even": "agent_[02]", "odd": ".*"}
    result = mpirun(3, "run", str(write_config(tmp_path, cfg)))
    assert result.returncode == 0, result.stdout + result.stderr
    for extra in ([], ["--deterministic"]):
        played = mpirun(1, "eval", str(run_dir(cfg)), "--episodes", "2", "--trust-env-code", *extra)
        assert played.returncode == 0 and "2 episodes" in played.stdout, played.stdout + played.stderr
