"""SAC and TD3 (algos/sac.py, models/sac.py, workers/action_writer.py) against hand-computed cases:
the squashed Gaussian's log-probability, the targets and losses, the entropy coefficient's update,
the targets' Polyak step, TD3's delayed actor and smoothed targets, and the config's refusals."""
import math

import numpy as np
import pytest
import torch

from hpcrl.algos.replay import PrioritizedReplay
from hpcrl.algos.sac import (SACStep, TD3Step, alpha_loss, clipped_double_target, critic_loss, polyak,
                             sac_actor_loss, smoothed_target_actions, soft_target, td3_actor_loss)
from hpcrl.core.config import ConfigError, parse_config
from hpcrl.envs import EnvSpaces
from hpcrl.models import build_optimizer, build_policy, make_runner

PENDULUM = EnvSpaces((3,), "float32", 0, (1,), "float32", action_low=(-2.0,), action_high=(2.0,))
TWO_D = EnvSpaces((4,), "float32", 0, (2,), "float32", action_low=(-1.0, 0.0), action_high=(1.0, 4.0))


def config(name: str = "sac", **sac):
    text = f"env: {{id: Pendulum-v1}}\nalgo: {{name: {name}, lr: 0.01, sac: {sac or {}}}}\nmodel: {{hidden_sizes: [16]}}"
    return parse_config(text.replace("'", ""))


def test_the_squashed_gaussian_log_probability_is_tanh_transformed_normal():
    torch.manual_seed(0)
    model = build_policy(TWO_D, config())
    obs, noise = torch.randn(5, 4), torch.randn(5, 2)
    actions, logp = model.sample(obs, noise=noise)
    h = model._hidden(obs)
    log_std = -5.0 + 0.5 * 7.0 * (torch.tanh(model.log_std(h)) + 1.0)
    u = model.mean(h) + log_std.exp() * noise
    normal = torch.distributions.Normal(model.mean(h), log_std.exp())
    expected = (normal.log_prob(u) - torch.log(1 - torch.tanh(u) ** 2 + 1e-6)).sum(-1)
    torch.testing.assert_close(actions, torch.tanh(u))
    torch.testing.assert_close(logp, expected)
    assert actions.abs().max() < 1.0
    # a player steps the env in its bounds: [-1, 1] -> [-1, 1] and [0, 4]
    torch.testing.assert_close(model.to_env(torch.tensor([[-1.0, -1.0], [1.0, 1.0], [0.0, 0.5]])),
                               torch.tensor([[-1.0, 0.0], [1.0, 4.0], [0.0, 3.0]]))


def test_targets_and_losses_by_hand():
    g, d = torch.tensor([1.0, 2.0]), torch.tensor([0.9, 0.0])  # the second transition ended its episode
    q1, q2, logp = torch.tensor([3.0, 5.0]), torch.tensor([4.0, 1.0]), torch.tensor([-1.0, 2.0])
    # SAC: 1 + 0.9 (min(3, 4) - 0.5 (-1)) = 4.15; 2 + 0 = 2
    torch.testing.assert_close(soft_target(g, d, q1, q2, logp, 0.5), torch.tensor([4.15, 2.0]))
    torch.testing.assert_close(clipped_double_target(g, d, q1, q2), torch.tensor([3.7, 2.0]))
    y, w = torch.tensor([2.0, 2.0]), torch.tensor([1.0, 0.5])
    # 0.5 mean(w ((q1 - y)^2 + (q2 - y)^2)) = 0.5 (1 (1 + 4) + 0.5 (9 + 1)) / 2 = 2.5
    assert float(critic_loss(q1, q2, y, w)) == pytest.approx(2.5)
    # mean(alpha logp - min(q1, q2)) = (0.5 (-1) - 3 + 0.5 (2) - 1) / 2 = -1.75
    assert float(sac_actor_loss(logp, q1, q2, 0.5)) == pytest.approx(-1.75)
    assert float(td3_actor_loss(q1)) == pytest.approx(-4.0)


def test_the_entropy_coefficient_rises_while_the_entropy_is_below_its_target():
    """d/d(log alpha) of -mean(log alpha (log pi + H)) is -mean(log pi + H): negative (alpha
    grows under gradient descent) when -log pi, the entropy, is below the target H."""
    log_alpha = torch.tensor(0.0, requires_grad=True)
    logp = torch.tensor([1.0, 3.0], requires_grad=True)  # entropy about -2
    loss = alpha_loss(log_alpha, logp, target_entropy=-1.0)
    loss.backward()
    assert float(log_alpha.grad) == pytest.approx(-(2.0 - 1.0))
    assert logp.grad is None  # the log-probs are detached: this loss trains alpha alone


def test_the_targets_follow_by_a_polyak_step():
    target, online = [torch.tensor([0.0, 10.0])], [torch.tensor([1.0, 0.0])]
    polyak(target, online, 0.1)
    torch.testing.assert_close(target[0], torch.tensor([0.1, 9.0]))


def test_target_policy_smoothing_clips_its_noise_and_the_actions():
    actions = torch.zeros(20_000, 1)
    smoothed = smoothed_target_actions(actions, std=10.0, clip=0.5, generator=torch.Generator().manual_seed(0))
    assert smoothed.min() == -0.5 and smoothed.max() == 0.5  # std 10: nearly all clipped
    at_edge = smoothed_target_actions(torch.ones(100, 1), std=0.2, clip=0.5, generator=torch.Generator().manual_seed(1))
    assert at_edge.max() == 1.0  # never outside [-1, 1]


class Shard:
    """The batch-source calls a step makes (workers/replay_source.ReplaySource's), over a real
    prioritized replay of random Pendulum transitions."""

    def __init__(self, rows: int = 512, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.replay = PrioritizedReplay(rows, {"obs": (np.float32, (3,)), "actions": (np.float32, (1,)),
                                               "returns": (np.float32, ()), "discounts": (np.float32, ()),
                                               "next_obs": (np.float32, (3,))}, alpha=0.0)
        self.replay.add({"obs": rng.normal(size=(rows, 3)).astype(np.float32),
                         "actions": rng.uniform(-1, 1, (rows, 1)).astype(np.float32),
                         "returns": rng.normal(size=rows).astype(np.float32),
                         "discounts": np.full(rows, 0.99, dtype=np.float32),
                         "next_obs": rng.normal(size=(rows, 3)).astype(np.float32)})
        self.rng = rng

    def steps_due(self, sum_over_learners) -> int:
        return 1  # algo.sac.gradient_steps' default, as an async run's shard says

    def sample(self):
        return self.replay.sample(32, 1.0, self.rng)

    def update_priorities(self, indices, td):
        self.replay.update_priorities(indices, td)

    def metrics(self):
        return {"replay_size": float(self.replay.size)}


def step_of(cfg, cls):
    torch.manual_seed(1)
    model = build_policy(PENDULUM, cfg)
    return cls(cfg, model, build_optimizer(model, cfg), torch.device("cpu"), np.random.default_rng(2),
               "float32", "float32")


def snapshot(params):
    return [p.detach().clone() for p in params]


def test_a_sac_step_trains_critics_actor_and_alpha_and_moves_the_targets_by_tau():
    step = step_of(config(tau=0.1, target_entropy=100.0), SACStep)
    model = step.model
    critics, target, actor = (snapshot(model.critic_parameters()), snapshot(step.target.critic_parameters()),
                              snapshot(model.actor_parameters()))
    metrics = step(Shard())
    assert set(metrics) >= {"critic_loss", "actor_loss", "q_mean", "alpha", "td_error", "replay_size"}
    for old, new in ((critics, model.critic_parameters()), (actor, model.actor_parameters())):
        assert all(not torch.equal(a, b) for a, b in zip(old, new))
    for old_t, new_c, new_t in zip(target, model.critic_parameters(), step.target.critic_parameters()):
        torch.testing.assert_close(new_t, 0.9 * old_t + 0.1 * new_c)  # after the critics' step
    # the entropy target: far above any entropy here, alpha rises; far below, it falls
    assert model.log_alpha.item() > 0.0
    low = step_of(config(target_entropy=-100.0), SACStep)
    low(Shard())
    assert low.model.log_alpha.item() < 0.0
    fixed = step_of(config(alpha=0.2), SACStep)
    before = fixed.model.log_alpha.item()
    assert fixed(Shard())["alpha"] == pytest.approx(0.2)
    assert fixed.model.log_alpha.item() == before  # a fixed coefficient is never trained


def test_td3_trains_its_actor_and_target_actor_every_policy_delay_steps():
    step = step_of(config("td3", policy_delay=2, tau=0.5), TD3Step)
    model = step.model
    history = []
    for _ in range(3):
        actor, critics = snapshot(model.actor_parameters()), snapshot(model.critic_parameters())
        target_actor = snapshot(step.target.actor_parameters())
        step(Shard())
        history.append((any(not torch.equal(a, b) for a, b in zip(actor, model.actor_parameters())),
                        any(not torch.equal(a, b) for a, b in zip(target_actor, step.target.actor_parameters())),
                        all(not torch.equal(a, b) for a, b in zip(critics, model.critic_parameters()))))
    # gradient steps 0, 1, 2: the actor and its target move at 0 and 2 only; the critics every time
    assert history == [(True, True, True), (False, False, True), (True, True, True)]


def test_runners_act_in_minus_one_to_one_and_players_in_the_envs_bounds():
    cfg = config()
    torch.manual_seed(0)
    obs = np.random.default_rng(0).normal(size=(64, 3)).astype(np.float32)
    out = {"actions": np.zeros((64, 1), dtype=np.float32)}
    make_runner(build_policy(PENDULUM, cfg), "cpu", seed=0).act(obs, out)
    assert np.abs(out["actions"]).max() <= 1.0 and len(np.unique(out["actions"])) > 32  # sampled
    greedy = make_runner(build_policy(PENDULUM, cfg), "cpu", seed=0, play="greedy")
    played = {"actions": np.zeros((64, 1), dtype=np.float32)}
    greedy.act(obs, played)
    expected = 2.0 * np.tanh(greedy.model.mean(greedy.model._hidden(torch.as_tensor(obs))).detach().numpy())
    np.testing.assert_allclose(played["actions"], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("text, match", [
    ("algo: {name: sac}", r"algo.name: sac needs a Box \(continuous\) action space, and CartPole-v1 has 2 "
                          r"Discrete actions; use algo.name: dqn or ppo"),
    ("env: {id: Pendulum-v1}\nalgo: {name: sac, sac: {learning_starts: 2000}, replay: {capacity: 1000}}",
     r"algo.sac.learning_starts: 2,000 random frames would not fit algo.replay.capacity \(1,000 transitions\)"),
    ("env: {id: Pendulum-v1}\nalgo: {name: td3, sac: {tau: 0}}", r"algo.sac.tau: expected a Polyak step in \(0, 1\]"),
    ("env: {id: Pendulum-v1}\nalgo: {name: sac}\nmodel: {core: lstm}", r"model.core: algo.name sac has no recurrent"),
    ("env: {id: Pendulum-v1}\nalgo: {name: sac, batch_frames: 256}", r"algo.batch_frames: set to 256, but algo.name sac does not read it"),
])
def test_sac_and_td3_configs_are_refused_with_the_key_to_change(text, match):
    with pytest.raises(ConfigError, match=match):
        cfg = parse_config(text)
        build_policy(EnvSpaces((4,), "float32", 2) if "CartPole" in match else PENDULUM, cfg)


def test_replay_defaults_resolve_per_algorithm():
    sac = parse_config("env: {id: Pendulum-v1}\nalgo: {name: sac, sac: {learning_starts: 100}}")
    assert sac.algo.replay.alpha == 0.0 and sac.algo.replay.warmup == 256  # at least a batch
    dqn = parse_config("algo: {name: dqn}")
    assert dqn.algo.replay.alpha == 0.6 and dqn.algo.replay.warmup == 50_000
    assert math.isclose(parse_config("env: {id: Pendulum-v1}\nalgo: {name: sac, replay: {alpha: 0.6}}")
                        .algo.replay.alpha, 0.6)


def test_actors_act_at_random_until_learning_starts_then_take_the_policys_actions():
    """The writer's actions (workers/action_writer.py), all in [-1, 1]: uniform before
    algo.sac.learning_starts frames of the run (this rank's frames x env ranks), then SAC's as
    the policy sampled them, TD3's with Gaussian noise of std exploration_noise, clipped."""
    from hpcrl.workers.action_writer import ActionWriter
    policy = {"actions": np.full((4000, 1), 0.9, dtype=np.float32)}
    for name, noise in (("sac", 0.0), ("td3", 0.3)):
        writer = ActionWriter(config(name, learning_starts=1000, exploration_noise=0.3), env_ranks=2, frames=499)
        writer.rng = np.random.default_rng(0)
        early = writer.actions(policy)
        assert -1.0 <= early.min() < -0.9 and 0.9 < early.max() <= 1.0  # 998 frames of the run: still random
        writer.frames = 500  # 1,000 frames of the run
        late = writer.actions(policy)
        assert late.dtype == np.float32 and late.max() <= 1.0
        if name == "sac":
            np.testing.assert_array_equal(late, policy["actions"])
        else:  # near the bound a third are clipped to 1; in the middle the noise is whole
            assert (late == 1.0).mean() > 0.3
            centred = writer.actions({"actions": np.zeros((4000, 1), dtype=np.float32)})
            assert 0.28 < np.std(centred) < 0.32 and abs(np.mean(centred)) < 0.02
