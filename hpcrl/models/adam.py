"""Adam for the trainers: torch.optim.Adam's fused kernel (`torch._fused_adam_`), called without
torch.optim's machinery around it.

Why not torch.optim.Adam itself: every Optimizer method (its constructor, step, zero_grad,
state_dict) is wrapped to keep torch.compile out, and that wrapper imports torch._dynamo on first
use: 1.0-1.2 s on this machine, on the learner's path to its first update, in a run that never
compiles anything. The arithmetic is the same kernel, so the steps are bit-identical to
torch.optim.Adam(fused=True) (tests/test_adam.py), and the state_dict has torch.optim.Adam's
layout, so checkpoints written by either load into the other.

Horovod's DistributedOptimizer wraps it as it wraps any optimizer: it subclasses the optimizer's
class and calls `__init__(param_groups)`, `step`, `zero_grad` and `load_state_dict`.
"""
from __future__ import annotations

from collections.abc import Iterable

import torch

from hpcrl.models.arena import pack, views_of

# The hyperparameters torch.optim.Adam writes into each group of its state_dict, with the values
# this Adam implements (amsgrad, maximize, decoupled weight decay and the rest are not offered).
FIXED = {"amsgrad": False, "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
         "fused": True, "decoupled_weight_decay": False}


class Adam:
    """Adam over `params` (tensors, or torch-style groups: dicts with "params" and overrides)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        groups = list(params)
        if groups and not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self.defaults = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, **FIXED}
        self.param_groups = [{**self.defaults, **group, "params": list(group["params"])} for group in groups]
        self.state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}  # param -> its moments and step

    def _state_of(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state.get(param)
        if state is None:  # created at a parameter's first step, as torch.optim.Adam does
            state = self.state[param] = {
                "step": torch.zeros((), dtype=torch.float32, device=param.device),
                "exp_avg": torch.zeros_like(param, memory_format=torch.preserve_format),
                "exp_avg_sq": torch.zeros_like(param, memory_format=torch.preserve_format)}
        return state

    def ensure_state(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Every parameter's step and moments as views of three arenas (its steps, first and
        second moments back to back, in parameter order), which are returned: what a population
        member's copy sends and receives in place (models/member.py). Values are kept; a
        parameter that has not stepped yet gets zeros. Done once; later calls find the arenas."""
        params = [p for group in self.param_groups for p in group["params"]]
        states = [self._state_of(p) for p in params]
        names = ("step", "exp_avg", "exp_avg_sq")
        arenas = getattr(self, "_arenas", None)
        if arenas is not None and all(views_of([s[n] for s in states], a) for n, a in zip(names, arenas)):
            return arenas
        arenas = []
        for name in names:
            arena, views = pack([s[name] for s in states], f"the optimizer's {name}")
            for state, view in zip(states, views):
                state[name] = view
            arenas.append(arena)
        self._arenas = tuple(arenas)
        return self._arenas

    def step(self, closure=None) -> None:
        """One Adam step for every parameter that has a gradient (`closure` is not supported:
        the argument exists because Horovod's wrapper passes it on)."""
        if closure is not None:
            raise ValueError("hpcrl's Adam takes no closure")
        with torch.no_grad():
            for group in self.param_groups:
                by_kind: dict[tuple, list[torch.Tensor]] = {}  # the kernel takes one device and dtype
                for p in group["params"]:
                    if p.grad is not None:
                        by_kind.setdefault((p.device, p.dtype), []).append(p)
                beta1, beta2 = group["betas"]
                for params in by_kind.values():
                    states = [self._state_of(p) for p in params]
                    steps = [s["step"] for s in states]
                    torch._foreach_add_(steps, 1)
                    torch._fused_adam_(params, [p.grad for p in params], [s["exp_avg"] for s in states],
                                       [s["exp_avg_sq"] for s in states], [], steps, amsgrad=False,
                                       lr=group["lr"], beta1=beta1, beta2=beta2,
                                       weight_decay=group["weight_decay"], eps=group["eps"], maximize=False,
                                       grad_scale=None, found_inf=None)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().zero_()

    def state_dict(self) -> dict:
        """torch.optim.Adam's layout: parameters numbered in group order; the state's tensors are
        this optimizer's own (copy them before changing them)."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {key: value for key, value in group.items() if key != "params"}
            packed["params"] = [index.setdefault(id(p), len(index)) for p in group["params"]]
            groups.append(packed)
        return {"state": {index[id(p)]: state for p, state in self.state.items()}, "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """A state_dict of this Adam or of torch.optim.Adam (from a checkpoint, its numbers as
        tensors): the saved hyperparameters and moments, checked against the parameters first."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups) or any(
                len(saved["params"]) != len(group["params"]) for saved, group in zip(saved_groups, self.param_groups)):
            raise ValueError(f"the optimizer state holds groups of {[len(g['params']) for g in saved_groups]} "
                             f"parameters; this model's optimizer has {[len(g['params']) for g in self.param_groups]}")
        param_of = {int(i): p for saved, group in zip(saved_groups, self.param_groups)
                    for i, p in zip(saved["params"], group["params"])}
        state: dict[torch.Tensor, dict[str, torch.Tensor]] = {}
        for key, saved in state_dict["state"].items():
            p = param_of[int(key)]
            for name in ("exp_avg", "exp_avg_sq"):
                if tuple(saved[name].shape) != tuple(p.shape):
                    raise ValueError(f"the optimizer state's {name} of parameter {key} has shape "
                                     f"{tuple(saved[name].shape)}; the parameter has {tuple(p.shape)}")
            values = {"step": torch.as_tensor(saved["step"]).to(dtype=torch.float32, device=p.device),
                      **{name: torch.as_tensor(saved[name]).to(dtype=p.dtype, device=p.device)
                         for name in ("exp_avg", "exp_avg_sq")}}
            if p in self.state:  # in place: the arenas of a member's state stay where they are
                for name, value in values.items():
                    self.state[p][name].copy_(value)
                state[p] = self.state[p]
            else:
                state[p] = {name: value.clone() for name, value in values.items()}
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({key: value for key, value in saved.items() if key != "params"})
            group["betas"] = tuple(group["betas"])
        self.state = state
