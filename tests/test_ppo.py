"""The PPO loss against hand-computed values, and the clipped gradient."""
import math

import numpy as np
import pytest
import torch

from hpcrl.algos.ppo import Batch, clip_grad_norm, ppo_loss, ppo_update, train_step
from hpcrl.core.config import AlgoConfig, ModelConfig
from hpcrl.envs import EnvSpaces
from hpcrl.models import build_model


class Fixed(torch.nn.Module):
    """evaluate() returns chosen log-probs, entropies and values (as leaf tensors)."""

    def __init__(self, logp, entropy, values):
        super().__init__()
        self.logp = torch.nn.Parameter(torch.tensor(logp))
        self.ent = torch.tensor(entropy)
        self.v = torch.nn.Parameter(torch.tensor(values))

    def evaluate(self, obs, actions, mask=None):
        return self.logp, self.ent, self.v

    def raw_of(self, returns):  # the critic learns in return units (no algo.value_norm)
        return returns


def batch(adv):
    n = len(adv)
    return Batch(obs=torch.zeros(n, 1), actions=torch.zeros(n, dtype=torch.int64), logp=torch.zeros(n),
                 values=torch.zeros(n), advantages=torch.tensor(adv), returns=torch.ones(n))


def test_loss_matches_hand_computation_and_clipping_stops_gradient():
    ratios = [0.5, 1.0, 1.5]
    model = Fixed([math.log(r) for r in ratios], [0.1, 0.2, 0.3], [1.0, 2.0, 3.0])
    cfg = AlgoConfig(clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, norm_adv=False)
    loss, stats = ppo_loss(model, batch([1.0, -1.0, 1.0]), cfg)
    # per sample max(-A r, -A clip(r)): -0.5, 1.0, -1.2
    pg = (-0.5 + 1.0 - 1.2) / 3
    v = 0.5 * (0 + 1 + 4) / 3
    assert float(stats["loss_policy"]) == pytest.approx(pg, abs=1e-6)
    assert float(stats["loss_value"]) == pytest.approx(v, abs=1e-6)
    assert float(stats["entropy"]) == pytest.approx(0.2, abs=1e-6)
    assert float(loss.detach()) == pytest.approx(pg + 0.5 * v - 0.01 * 0.2, abs=1e-6)
    assert float(stats["clip_frac"]) == pytest.approx(2 / 3)
    loss.backward()
    grad = model.logp.grad.numpy()
    assert grad[2] == 0.0  # ratio 1.5 > 1.2 with A > 0: clipped, no push further
    assert grad[0] == pytest.approx(-0.5 / 3, abs=1e-6)  # d(-A r)/dlogp = -A r


def test_update_improves_the_surrogate_on_a_real_model():
    torch.manual_seed(0)
    model = build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[16]))
    obs = torch.randn(64, 4)
    with torch.no_grad():
        actions, logp, values = model.sample(obs)
        p1_before = model.log_probs(obs).exp()[:, 1].mean()
    adv = torch.where(actions == 1, 1.0, -1.0)
    b = Batch(obs, actions, logp, values, adv, values + adv)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    cfg = AlgoConfig(epochs=4, num_minibatches=2)
    stats = ppo_update(model, opt, b, cfg, np.random.default_rng(0))
    assert set(stats) >= {"loss_policy", "loss_value", "entropy", "approx_kl", "clip_frac"}
    with torch.no_grad():
        p1_after = model.log_probs(obs).exp()[:, 1].mean()
    assert p1_after > p1_before + 0.05  # the advantage favoured action 1


def test_update_moves_a_gaussian_policy_towards_advantaged_actions():
    torch.manual_seed(0)
    spaces = EnvSpaces((4,), "float32", 0, action_shape=(2,), action_dtype="float32",
                       action_low=(-1.0, -1.0), action_high=(1.0, 1.0))
    model = build_model(spaces, ModelConfig(hidden_sizes=[16]))
    obs = torch.randn(256, 4)
    with torch.no_grad():
        actions, logp, values = model.sample(obs)
        mean_before = model.mode(obs)[:, 0].mean()
    assert actions.dtype == torch.float32 and actions.shape == (256, 2)
    adv = torch.where(actions[:, 0] > mean_before, 1.0, -1.0)  # larger first components were better
    b = Batch(obs, actions, logp, values, adv, values + adv)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    stats = ppo_update(model, opt, b, AlgoConfig(epochs=4, num_minibatches=4), np.random.default_rng(0))
    assert np.isfinite(list(stats.values())).all()
    with torch.no_grad():
        assert model.mode(obs)[:, 0].mean() > mean_before + 0.05


def test_the_observation_normaliser_takes_the_batch_after_the_update_so_first_ratios_are_1():
    """The batch was collected with the current stats: the update must see exactly those, and the
    normaliser folds the batch in afterwards (before, the first epoch's ratios were not 1)."""
    torch.manual_seed(0)
    model = build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[16], obs_norm=True))
    model.update_obs_norm(torch.randn(256, 4))  # some stats already
    obs = 5.0 + 3.0 * torch.randn(64, 4)  # far from them: folding this batch in moves the stats a lot
    with torch.no_grad():
        actions, logp, values = model.sample(obs)
    b = Batch(obs, actions, logp, values, torch.randn(64), values)
    opt = torch.optim.SGD(model.parameters(), lr=0.0)  # no weight change: the ratios show the stats alone
    stats = train_step(model, opt, b, AlgoConfig(epochs=1, num_minibatches=1), np.random.default_rng(0))
    assert stats["approx_kl"] == 0.0 and stats["clip_frac"] == 0.0
    with torch.no_grad():
        # the batch is in the stats now: the same weights act differently
        assert not torch.allclose(model.log_probs(obs).gather(1, actions[:, None]).squeeze(1), logp)


def test_inactive_rows_are_left_out_of_the_loss_and_its_gradient():
    """Multi-agent: rows whose agent did not act change neither the loss nor its gradient, whatever
    their advantages, returns and log-probs hold."""
    cfg = AlgoConfig(clip_coef=0.2, vf_coef=0.5, ent_coef=0.01, norm_adv=True)
    active = [1.0, 0.0, 1.0, 0.0]

    def run(junk: float):
        model = Fixed([0.1, junk, -0.1, junk], [0.2, junk, 0.3, junk], [1.0, junk, 2.0, junk])
        b = Batch(obs=torch.zeros(4, 1), actions=torch.zeros(4, dtype=torch.int64), logp=torch.zeros(4),
                  values=torch.tensor([0.5, junk, 1.5, junk]), advantages=torch.tensor([1.0, junk, -2.0, junk]),
                  returns=torch.tensor([1.5, junk, 0.5, junk]), active=torch.tensor(active))
        loss, stats = ppo_loss(model, b, cfg)
        loss.backward()
        return float(loss.detach()), model.logp.grad.clone(), model.v.grad.clone()

    loss_a, logp_grad_a, v_grad_a = run(0.0)
    loss_b, logp_grad_b, v_grad_b = run(50.0)
    assert loss_a == pytest.approx(loss_b, abs=1e-6)
    assert torch.allclose(logp_grad_a, logp_grad_b) and torch.allclose(v_grad_a, v_grad_b)
    assert logp_grad_a[1] == 0 and logp_grad_a[3] == 0 and v_grad_a[1] == 0 and v_grad_a[3] == 0
    # and the active rows alone, as a plain batch, give the same loss
    model = Fixed([0.1, -0.1], [0.2, 0.3], [1.0, 2.0])
    plain = Batch(obs=torch.zeros(2, 1), actions=torch.zeros(2, dtype=torch.int64), logp=torch.zeros(2),
                  values=torch.tensor([0.5, 1.5]), advantages=torch.tensor([1.0, -2.0]), returns=torch.tensor([1.5, 0.5]),
                  active=torch.ones(2))
    assert float(ppo_loss(model, plain, cfg)[0].detach()) == pytest.approx(loss_a, abs=1e-6)


def test_minibatches_keep_each_envs_agent_rows_together():
    b = Batch(*(torch.arange(12.0) for _ in range(6)), rows_together=3)
    parts = b.minibatches(np.random.default_rng(0), 2)
    assert sorted(torch.cat(parts).tolist()) == list(range(12))
    for idx in parts:
        groups = idx.reshape(-1, 3)
        assert (groups % 3 == torch.arange(3)).all() and (groups // 3 == groups[:, :1] // 3).all()
    single = Batch(*(torch.arange(8.0) for _ in range(6)))  # one row per env: PPO's permutation as before
    order = torch.cat(single.minibatches(np.random.default_rng(5), 4))
    assert order.tolist() == np.random.default_rng(5).permutation(8).tolist()


@pytest.mark.parametrize("envs, k, count", [(7, 1, 3), (7, 3, 3), (8, 2, 4), (5, 4, 5), (9, 1, 2)])
def test_minibatches_are_tensor_splits_of_a_permutation_of_whole_envs(envs, k, count):
    b = Batch(*(torch.arange(float(envs * k)) for _ in range(6)), rows_together=k)
    parts = b.minibatches(np.random.default_rng(3), count)
    shuffled = torch.from_numpy(np.random.default_rng(3).permutation(envs))
    expected = [(part[:, None] * k + torch.arange(k)).reshape(-1) for part in torch.tensor_split(shuffled, count)]
    assert [p.tolist() for p in parts] == [e.tolist() for e in expected]
    taken = b.take(parts[0])
    assert torch.equal(taken.advantages, b.advantages[expected[0]])



@pytest.mark.parametrize("max_norm", [0.5, 1e3])  # clipped, and left as it is
def test_clip_grad_norm_gives_torchs_numbers(max_norm):
    mine, torchs = [list(build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[16, 16])).parameters())
                    for _ in range(2)]
    torch.manual_seed(0)
    for a, b in zip(mine[1:], torchs[1:]):  # the first without a gradient: skipped, as torch skips it
        a.grad = torch.randn_like(a)
        b.grad = a.grad.clone()
    torch.nn.utils.clip_grad_norm_(torchs, max_norm)
    clip_grad_norm(mine, max_norm)
    assert mine[0].grad is None
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(mine[1:], torchs[1:]))


@pytest.mark.parametrize("continuous", [False, True])
def test_without_an_entropy_bonus_the_gradient_is_that_of_an_explicit_zero_term(continuous):
    spaces = (EnvSpaces((4,), "float32", 0, action_shape=(2,), action_dtype="float32", action_low=(-1.0, -1.0),
                        action_high=(1.0, 1.0)) if continuous else EnvSpaces((4,), "float32", 3))
    torch.manual_seed(0)
    model = build_model(spaces, ModelConfig(hidden_sizes=[16]))
    obs = torch.randn(32, 4)
    with torch.no_grad():
        actions, logp, values = model.sample(obs)
    b = Batch(obs, actions, logp + 0.1 * torch.randn(32), values, torch.randn(32), values + torch.randn(32))
    loss, _ = ppo_loss(model, b, AlgoConfig(ent_coef=0.0))
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    reference, _ = ppo_loss(model, b, AlgoConfig(ent_coef=0.0))
    reference = reference - 0.0 * model.evaluate(obs, actions)[1].mean()  # the term as it was written
    reference.backward()
    assert torch.equal(loss.detach(), reference.detach())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
