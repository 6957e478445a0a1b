"""DQN's pieces: the actors' n-step transitions and initial priorities (hand-computed), Ape-X
exploration, the double-DQN target, the Q-network, and the config errors a user can make."""
import numpy as np
import pytest
import torch

from hpcrl.algos.dqn import dqn_loss, td_errors
from hpcrl.algos.exploration import apex_epsilons
from hpcrl.algos.sequences import rescale, unrescale
from hpcrl.core.config import ConfigError, parse_config
from hpcrl.core.layout import plan_layout
from hpcrl.core.messages import transition_spec
from hpcrl.core.sizing import ReplayShard, Sizes
from hpcrl.envs import EnvSpaces, env_spaces
from hpcrl.models import build_policy
from hpcrl.models.q import QNetwork, QRunner
from hpcrl.workers.replay_writer import RecordRows
from hpcrl.workers.transition_writer import NStepWindow

G = 0.5


def window_and_writer(n=3, envs=1, rows=32):
    writer = RecordRows(transition_spec(rows, (1,), "float32", (), "int64").allocate())
    window = NStepWindow(n, G, envs, np.zeros((envs, 1), np.float32), np.zeros(envs, np.int64))
    return window, writer


def step(window, writer, t, reward, max_q, q_taken=0.0, terminated=False, truncated=False, final=None):
    """One env step of one env whose observation at step t is [t]."""
    obs = np.array([[float(t)]], np.float32)
    window.emit_due(obs, np.array([max_q]), writer)
    window.record(obs, np.array([t % 2]), np.array([q_taken]))
    ended = np.array([terminated or truncated])
    window.record_rewards(np.array([reward]), np.array([terminated]), ended,
                          None if final is None else np.array([[final]], np.float32), np.array([max_q]), writer)


def rows(writer):
    r = writer.record
    k = writer.rows
    return r["obs"][:k, 0], r["returns"][:k], r["discounts"][:k], r["next_obs"][:k, 0], r["priorities"][:k]


def test_a_full_window_emits_the_n_step_transition_bootstrapped_from_the_current_observation():
    window, writer = window_and_writer(n=3)
    for t, r in enumerate([1.0, 2.0, 3.0]):
        step(window, writer, t, r, max_q=0.0, q_taken=1.0)
    assert writer.rows == 0  # nothing is complete before step 3's Q-values are in
    step(window, writer, 3, 4.0, max_q=8.0)
    obs, returns, discounts, next_obs, priorities = rows(writer)
    assert obs.tolist() == [0.0] and next_obs.tolist() == [3.0]
    assert returns[0] == pytest.approx(1 + G * 2 + G * G * 3)
    assert discounts[0] == pytest.approx(G ** 3)
    assert priorities[0] == pytest.approx(abs(2.75 + G ** 3 * 8.0 - 1.0))  # |G + g^n max Q(s_3) - Q(s_0, a_0)|
    assert writer.record["actions"][0] == 0


def test_a_terminal_step_flushes_the_window_without_bootstrap():
    window, writer = window_and_writer(n=3)
    step(window, writer, 0, 1.0, max_q=5.0, q_taken=0.5)
    step(window, writer, 1, 2.0, max_q=5.0, q_taken=0.25, terminated=True, final=9.0)
    obs, returns, discounts, next_obs, priorities = rows(writer)
    assert sorted(zip(obs.tolist(), returns.tolist())) == [(0.0, 1 + G * 2), (1.0, 2.0)]
    assert discounts.tolist() == [0.0, 0.0]
    assert priorities.tolist() == pytest.approx([abs(2.0 - 0.25), abs(2.0 - 0.5)])  # newest first
    assert window.filled[0] == 0
    step(window, writer, 2, 7.0, max_q=0.0)  # the next episode starts with an empty window
    assert writer.rows == 2


def test_a_time_limit_flushes_the_window_into_the_final_observation_with_its_discounts():
    window, writer = window_and_writer(n=4)
    for t in range(2):
        step(window, writer, t, 1.0, max_q=2.0, truncated=t == 1, final=7.0 if t == 1 else None)
    obs, returns, discounts, next_obs, priorities = rows(writer)
    assert next_obs.tolist() == [7.0, 7.0]
    order = np.argsort(obs)
    assert discounts[order].tolist() == pytest.approx([G ** 2, G])  # step 0 is 2 steps from the end
    assert returns[order].tolist() == pytest.approx([1 + G, 1.0])


def test_every_env_step_makes_one_transition_in_the_long_run():
    window, writer = window_and_writer(n=3, rows=64)
    for t in range(40):
        step(window, writer, t, 1.0, max_q=0.0, terminated=t % 10 == 9, final=-1.0)
    assert writer.rows == 40  # 4 episodes of 10 steps, each flushed at its end


def test_apex_epsilons_run_from_eps_down_to_eps_to_the_1_plus_alpha():
    eps = apex_epsilons(0.4, 7.0, 16)
    assert eps[0] == pytest.approx(0.4) and eps[-1] == pytest.approx(0.4 ** 8)
    assert np.all(np.diff(eps) < 0)
    assert apex_epsilons(0.4, 7.0, 1).tolist() == [0.4]


class TableQ(torch.nn.Module):
    """Q-values looked up by the observation's integer value."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table, dtype=torch.float32))

    def q_values(self, obs):
        return self.table[obs.long()]


def test_double_dqn_values_the_online_networks_choice_with_the_target_network():
    online = TableQ([[0.0, 0.0], [1.0, 3.0]])  # in state 1 online prefers action 1
    target = TableQ([[0.0, 0.0], [5.0, 2.0]])  # target prefers action 0
    obs, nxt = torch.tensor([0]), torch.tensor([1])
    args = (obs, torch.tensor([1]), torch.tensor([1.0]), torch.tensor([0.5]), nxt)
    td_double, _ = td_errors(online, target, *args, double=True)
    td_plain, _ = td_errors(online, target, *args, double=False)
    assert td_double.item() == pytest.approx(1.0 + 0.5 * 2.0)  # target's value of online's argmax
    assert td_plain.item() == pytest.approx(1.0 + 0.5 * 5.0)  # target's own max
    # value rescaling: the networks hold h(Q), the target is h(G + discount h^-1(Q'))
    td_rescaled, _ = td_errors(online, target, *args, double=True, value_rescale=True)
    assert td_rescaled.item() == pytest.approx(rescale(1.0 + 0.5 * unrescale(2.0)), rel=1e-5)  # float32
    # importance weights scale each sample's Huber loss: quadratic below 1, linear above
    assert dqn_loss(torch.tensor([0.5, 3.0]), torch.tensor([1.0, 0.5])).item() == pytest.approx(
        (0.5 * 0.25 + 0.5 * 2.5) / 2)


def test_the_dueling_q_network_and_its_runner():
    cfg = parse_config("algo: {name: dqn}\nmodel: {hidden_sizes: [16]}")
    model = build_policy(env_spaces(cfg.env), cfg)
    assert isinstance(model, QNetwork) and model.value is not None
    obs = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    q = model.q_values(torch.as_tensor(obs))
    features = model.features(torch.as_tensor(obs))
    advantage = model.advantage(features)
    # Q - V is the advantage centred on its mean: the value stream carries the mean of Q
    torch.testing.assert_close(q - model.value(features), advantage - advantage.mean(-1, keepdim=True))
    runner = QRunner(model, "cpu", seed=0)
    out = {"q": np.zeros((5, 2), np.float32)}
    runner.act(obs, out)
    np.testing.assert_allclose(out["q"], q.detach().numpy(), rtol=1e-6)
    best = np.zeros(5, np.float32)
    runner.value(obs, best)
    np.testing.assert_allclose(best, out["q"].max(1), rtol=1e-6)
    for play in ("sample", "greedy"):  # hpcrl eval: a Q-network plays greedily (exploration is the actors')
        actions = {"actions": np.zeros(5, np.int64)}
        QRunner(model, "cpu", seed=0, play=play).act(obs, actions)
        np.testing.assert_array_equal(actions["actions"], out["q"].argmax(1))


def test_dqn_config_defaults_and_mistakes():
    cfg = parse_config("algo: {name: dqn}")
    assert cfg.algo.mode == "async"
    assert parse_config("algo: {name: ppo}").algo.mode == "sync"
    for text, match in [
        ("algo: {name: dqn, mode: lockstep}", r"algo.mode: expected 'async' or 'sync' \(the modes of algo.name dqn\)"),
        ("algo: {name: dqn, dqn: {eps_schedule: cosine}}", r"algo.dqn.eps_schedule: expected one of apex, linear"),
        ("algo: {name: dqn, replay: {capacity: 100, warmup: 1000}}", r"algo.replay.warmup: expected between"),
        ("algo: {name: dqn, rollout_length: 3, dqn: {n_step: 3}}", r"algo.rollout_length: .* more than"),
        ("algo: {name: dqn, batch_frames: 1024}", r"algo.batch_frames: set to 1024, but algo.name dqn does not read it \(only ppo, mappo, ippo\)"),
        ("env: {normalize_reward: true}\nalgo: {name: dqn}", r"env.normalize_reward: not supported"),
    ]:
        with pytest.raises(ConfigError, match=match):
            parse_config(text)
    three = parse_config("roles: {learner: {ranks: 3}}\nalgo: {name: dqn, dqn: {batch_size: 64}}")
    with pytest.raises(ConfigError, match=r"algo.dqn.batch_size: 64 .* 3 learners; use a multiple of 3 "
                                          r"\(nearest: 63 or 66\)"):
        Sizes.of(three, plan_layout(three.roles, 8))
    two = parse_config("roles: {learner: {ranks: 2}}\nalgo: {name: dqn, replay: {capacity: 1001, warmup: 501}}")
    assert Sizes.of(two, plan_layout(two.roles, 8)).busiest.replay == ReplayShard(501, 251, 32)


def test_dqn_refuses_continuous_actions_with_the_way_out():
    cfg = parse_config("env: {id: Pendulum-v1}\nalgo: {name: dqn}")
    with pytest.raises(ConfigError, match=r"dqn needs a Discrete action space.*use algo.name: ppo"):
        build_policy(EnvSpaces((3,), "float32", 0, (1,), "float32"), cfg)
