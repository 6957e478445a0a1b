"""A population member's whole state (weights, normaliser statistics, Adam's steps and moments)
as a few contiguous arrays that share memory with the tensors the trainer uses, so that
`runtime/member_copy.py` sends and receives it in place, as few large messages.

The parameters are re-homed once as views of one contiguous tensor (their values kept; the
Parameter objects, and so every optimizer, hook and module that holds them, stay the same), and
Adam's state lives in three more (`Adam.ensure_state`). One message per array: with a message per
tensor (36 for a 10M-parameter actor-critic) a copy took 1.8-2.1x a plain MPI.Send of the same
bytes here; with the arenas, about the same as the plain send (bench/population.py).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from hpcrl.models.adam import Adam
from hpcrl.models.arena import pack, views_of


def flatten_parameters(model: nn.Module) -> torch.Tensor:
    """The model's parameters as views of one contiguous tensor, which is returned (done once;
    later calls find it in place)."""
    params = list(model.parameters())
    arena = getattr(model, "_hpcrl_parameter_arena", None)
    if views_of(params, arena):
        return arena
    arena, views = pack(params, "the model's parameters")
    for p, view in zip(params, views):
        p.data = view  # the same Parameter object, its storage now the arena's
    object.__setattr__(model, "_hpcrl_parameter_arena", arena)  # a plain attribute: not a buffer, not saved
    return arena


def member_arrays(model: nn.Module, optimizer: Adam) -> list[np.ndarray]:
    """A member's state as arrays sharing memory with its tensors, in an order fixed by the
    config: the parameters' arena, each buffer (normaliser statistics), then Adam's steps, first
    and second moments (each an arena; zero where no step has run yet)."""
    arrays = [flatten_parameters(model), *model.buffers(), *optimizer.ensure_state()]
    if any(t.device.type != "cpu" for t in arrays):
        raise ValueError("a member's state is copied from host memory: its model and optimizer must be on the "
                         "CPU (roles.learner.device: cpu) to be sent in place")
    return [t.detach().numpy() for t in arrays]


def member_layout(model: nn.Module) -> str:
    """Every tensor of the model's state by name, shape and dtype: equal on two members whose
    states can be copied one onto the other (runtime/member_copy.MemberState.fingerprint)."""
    return ";".join(f"{name}{tuple(t.shape)}{t.dtype}" for name, t in model.state_dict().items())
