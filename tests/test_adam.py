"""hpcrl's Adam (models/adam.py) against torch.optim.Adam(fused=True): the same steps bit for bit,
the same state_dict layout, checkpoints that load either way, and no torch._dynamo import."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from hpcrl.core.config import ModelConfig
from hpcrl.envs import EnvSpaces
from hpcrl.io.checkpoint import load_checkpoint, save_checkpoint
from hpcrl.models import build_model
from hpcrl.models.adam import Adam
from tests.conftest import REPO


def model(seed: int = 0):
    torch.manual_seed(seed)
    return build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[8, 8]))


def train(net, opt, steps: int, seed: int = 1, lr_at: dict | None = None) -> None:
    """`steps` Adam steps on a loss that leaves the value head without a gradient at odd steps
    (a parameter without a gradient is skipped, and gets no state until its first one)."""
    gen = torch.Generator().manual_seed(seed)
    for i in range(steps):
        if lr_at and i in lr_at:
            for group in opt.param_groups:
                group["lr"] = lr_at[i]
        opt.zero_grad()
        obs = torch.randn(6, 4, generator=gen)
        logp, entropy, value = net.evaluate(obs, torch.zeros(6, dtype=torch.int64))
        loss = logp.sum() + entropy.sum() + (value.sum() if i % 2 == 0 else 0)
        loss.backward()
        opt.step()


def test_steps_are_bit_identical_to_torch_fused_adam():
    ours, theirs = model(), model()
    opt_ours = Adam(ours.parameters(), lr=3e-3, eps=1e-5)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=3e-3, eps=1e-5, fused=True)
    train(ours, opt_ours, 7, lr_at={4: 1e-3})
    train(theirs, opt_theirs, 7, lr_at={4: 1e-3})
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a, b)
    mine, torch_sd = opt_ours.state_dict(), opt_theirs.state_dict()
    assert mine["param_groups"] == torch_sd["param_groups"]  # every hyperparameter key, as torch writes it
    assert mine["state"].keys() == torch_sd["state"].keys()
    for key in mine["state"]:
        assert mine["state"][key].keys() == torch_sd["state"][key].keys() == {"step", "exp_avg", "exp_avg_sq"}
        for name, tensor in mine["state"][key].items():
            assert tensor.dtype == torch_sd["state"][key][name].dtype
            assert torch.equal(tensor, torch_sd["state"][key][name]), (key, name)


@pytest.mark.parametrize("saved_by", ["hpcrl", "torch"])
def test_a_checkpoint_of_either_optimizer_resumes_the_other_exactly(tmp_path, saved_by):
    """Run directories written before hpcrl had its own Adam hold torch.optim.Adam's state; a
    resume continues from it as if nothing had changed, and the other way round."""
    first = model()
    opt = Adam(first.parameters(), lr=1e-3, eps=1e-5) if saved_by == "hpcrl" else \
        torch.optim.Adam(first.parameters(), lr=1e-3, eps=1e-5, fused=True)
    train(first, opt, 3)
    path = str(tmp_path / "checkpoint.h5")
    save_checkpoint(path, first, opt, {"frames": 1}, np.random.default_rng(0), "run: {}\n")
    train(first, opt, 4, seed=2)  # the run that was not stopped

    ck = load_checkpoint(path)
    resumed = model(seed=5)
    resumed.load_state_dict(ck["model"])
    other = torch.optim.Adam(resumed.parameters(), lr=0.5, fused=True) if saved_by == "hpcrl" else \
        Adam(resumed.parameters(), lr=0.5)
    other.load_state_dict(ck["optimizer"])  # the saved lr and eps replace the fresh ones
    assert other.param_groups[0]["lr"] == 1e-3 and other.param_groups[0]["eps"] == 1e-5
    train(resumed, other, 4, seed=2)
    for a, b in zip(first.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


def test_a_state_that_does_not_fit_the_model_is_refused_by_name():
    small, wide = model(), build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=[8, 16]))
    opt = Adam(small.parameters())
    train(small, opt, 1)
    with pytest.raises(ValueError, match=r"exp_avg of parameter \d+ has shape \(8, 8\); the parameter has \(16, 8\)"):
        Adam(wide.parameters()).load_state_dict(opt.state_dict())
    with pytest.raises(ValueError, match="groups of"):
        Adam(list(wide.parameters())[:3]).load_state_dict(opt.state_dict())


def test_zero_grad_and_closure():
    net = model()
    opt = Adam(net.parameters())
    train(net, opt, 1)
    assert any(p.grad is not None for p in net.parameters())
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is None or not p.grad.any() for p in net.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    with pytest.raises(ValueError, match="no closure"):
        opt.step(lambda: 0.0)


def test_building_and_stepping_never_imports_dynamo():
    """The reason this Adam exists: torch.optim's first use imports torch._dynamo (about 1 s)."""
    code = ("import sys, torch\n"
            "from hpcrl.core.config import load_config\n"
            "from hpcrl.envs import env_spaces\n"
            "from hpcrl.models import build_optimizer, build_policy\n"
            "cfg = load_config('jobs/cartpole_ppo.yaml')[0]\n"
            "net = build_policy(env_spaces(cfg.env), cfg)\n"
            "opt = build_optimizer(net, cfg)\n"
            "logp, ent, v = net.evaluate(torch.zeros(3, 4), torch.zeros(3, dtype=torch.int64))\n"
            "(logp.sum() + v.sum()).backward(); opt.step(); opt.zero_grad(); opt.state_dict()\n"
            "assert 'torch._dynamo' not in sys.modules\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
