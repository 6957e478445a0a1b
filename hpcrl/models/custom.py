"""The user's own encoder: `model.encoder: "package.module:Class"` (docs/custom-models.md).

The contract: `Class(input_shape, **model.encoder_kwargs)` is a torch `nn.Module` with an
`out_features` attribute (a positive int); its forward takes a batch of observations and returns
[B, out_features] floats (core/network_shapes.custom_input_shape). A Box observation comes as a
float32 tensor [B, *input_shape], uint8 frames scaled to [0, 1] and normalised with model.obs_norm;
a Dict or Tuple observation as a dict of its leaves by key (`input_shape` a dict of their shapes),
each a float32 tensor so prepared, a Discrete leaf an int64 tensor [B] of ids. hpcrl keeps the
rest: the policy and value heads or the Q head, the recurrent core, the normalisers, the weights
messages, checkpoints and everything distributed. Its parameters and buffers travel in the weights
message as float32, as hpcrl's own.

Only ranks that build a policy import the class: learners, policy servers, and env ranks with
inline inference (serial mode); env ranks with remote inference never do. The config that names
it is the user's, so it is trusted; a run directory someone else wrote is not, and `hpcrl eval`
imports nothing it names without --trust-code (tools/evaluate.py).

Every way the class can fail is a ConfigError naming the key, the class and what was wrong, found
at start-up on rank 0 (launch/startup.py), before anything is written.
"""
from __future__ import annotations

import importlib

import torch
from torch import nn

from hpcrl.core.config import ModelConfig
from hpcrl.core.config_base import ConfigError
from hpcrl.core.network_shapes import CustomTrunk

PROBE_ROWS = 2  # the zero observations a new encoder's forward is checked on
Shape = tuple[int, ...] | dict[str, tuple[int, ...]]  # an observation's, or a Dict observation's leaves' by key


def encoder_class(cfg: ModelConfig) -> type:
    """The class model.encoder names, imported; a ConfigError if it cannot be, or is no nn.Module."""
    module_name, name = cfg.encoder.split(":", 1)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # (the user's module: anything may go wrong in it)
        raise ConfigError(f"model.encoder: cannot import module {module_name!r} for {cfg.encoder!r}: "
                          f"{type(exc).__name__}: {exc}; check the name, and that the module is on the import path "
                          f"of every learner and policy server (the working directory, or an installed "
                          f"package)") from None
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        found = (f"module {module_name!r} has no {name!r}" if cls is None else
                 f"{name!r} is a class, but not a subclass of torch.nn.Module" if isinstance(cls, type) else
                 f"{name!r} is a {type(cls).__name__}, not a class")
        raise ConfigError(f"model.encoder: {cfg.encoder!r} should name a torch nn.Module class; {found}")
    return cls


def build_encoder(cfg: ModelConfig, input_shape: Shape) -> tuple[nn.Module, int]:
    """The user's encoder for observations of `input_shape` (a dict of leaves' shapes for a Dict
    or Tuple observation), and its out_features, checked by one forward pass on a batch of zero
    observations (its output's shape and dtype)."""
    encoder, width = _instance(cfg, input_shape)
    probe = _zeros(input_shape)
    what = f"a batch of {PROBE_ROWS} zero observations ({_described(input_shape)})"
    try:
        with torch.no_grad():
            out = encoder(probe)
    except Exception as exc:
        raise ConfigError(f"model.encoder: {cfg.encoder}'s forward fails on {what}: {type(exc).__name__}: "
                          f"{exc}") from None
    if not isinstance(out, torch.Tensor) or not out.is_floating_point() or tuple(out.shape) != (PROBE_ROWS, width):
        got = (f"a {out.dtype} tensor of shape {list(out.shape)}" if isinstance(out, torch.Tensor)
               else f"a {type(out).__name__}")
        raise ConfigError(f"model.encoder: {cfg.encoder}'s forward should return floats of shape [batch, "
                          f"out_features] = {[PROBE_ROWS, width]} for {what}; it returned {got}")
    return encoder, width


def _zeros(input_shape: Shape):
    if isinstance(input_shape, dict):  # a Dict or Tuple observation's leaves; () a Discrete leaf's id
        return {key: torch.zeros(PROBE_ROWS, dtype=torch.int64) if shape == () else
                torch.zeros((PROBE_ROWS, *shape), dtype=torch.float32) for key, shape in input_shape.items()}
    return torch.zeros((PROBE_ROWS, *input_shape), dtype=torch.float32)


def _described(input_shape: Shape) -> str:
    if isinstance(input_shape, dict):
        return "a dict of " + ", ".join(f"{key!r}: {[PROBE_ROWS, *shape]}{' int64' if shape == () else ''}"
                                        for key, shape in input_shape.items())
    return f"float32 of shape {[PROBE_ROWS, *input_shape]}"


def custom_trunk(cfg: ModelConfig):
    """What core/network_shapes counts of the user's encoder (`CustomTrunks`): built on the meta
    device, so nothing is allocated, whatever its size."""
    def built(input_shape: Shape) -> CustomTrunk:
        try:
            with torch.device("meta"):
                encoder, width = _instance(cfg, input_shape)
        except ConfigError:  # (a class that cannot be built without memory, or cannot be built at all)
            encoder, width = _instance(cfg, input_shape)
        tensors = [*encoder.parameters(), *encoder.buffers()]
        return CustomTrunk(tuple(tuple(t.shape) for t in tensors), width)
    return built


def _instance(cfg: ModelConfig, input_shape: Shape) -> tuple[nn.Module, int]:
    cls = encoder_class(cfg)
    try:
        encoder = cls(dict(input_shape) if isinstance(input_shape, dict) else tuple(input_shape),
                      **cfg.encoder_kwargs)
    except Exception as exc:
        raise ConfigError(f"model.encoder: {cfg.encoder}({input_shape}, **model.encoder_kwargs "
                          f"{cfg.encoder_kwargs}) fails: {type(exc).__name__}: {exc}") from None
    width = getattr(encoder, "out_features", None)
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ConfigError(f"model.encoder: {cfg.encoder} should set out_features, the width of its output, to a "
                          f"positive int; it has {width!r}")
    return encoder, width
