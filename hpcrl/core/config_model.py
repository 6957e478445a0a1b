"""The config's model section (the policy network: models/): its keys and their checks.

Pure Python, like the rest of the config (core/config.py assembles it).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from hpcrl.core.config_base import OneOf, Range, check, check_ranges, doc, shown

ENCODERS = ("auto", "mlp", "cnn", "grid")
# the user's own encoder: 'package.module:Class', a torch nn.Module (models/custom.py, docs/custom-models.md)
IMPORT_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
GRID_POLICIES = ("mlp", "columns", "landing", "cells")
CORES = ("none", "lstm", "gru")
MAX_LAYERS, MAX_WIDTH = 64, 65_536  # model.hidden_sizes, model.core_size
MAX_KERNEL = 64  # model.grid_convs: boards are small


@dataclass
class ModelConfig:
    """The actor-critic network."""

    hidden_sizes: list = doc("widths of the hidden layers of the actor and of the critic MLPs (MLP encoder)",
                             default_factory=lambda: [64, 64])
    activation: str = doc("'tanh' or 'relu' (MLP encoder)", range=OneOf(("tanh", "relu")), default="tanh")
    encoder: str = doc("'mlp' (flattened observations; separate actor and critic MLPs), 'cnn' (the Nature CNN "
                       "of Mnih et al. 2015 over channel-first [C, H, W] frame stacks, one trunk for both heads; "
                       "uint8 frames are scaled by 1/255), 'grid' (small boards as channel-last [H, W, C] planes, "
                       "as PettingZoo's classic games give: the convolutions of grid_convs, then an MLP of "
                       "hidden_sizes; one trunk for both heads), 'auto' (cnn for 3-D observations, mlp otherwise), "
                       "or your own: 'package.module:Class', a torch nn.Module built as Class(input_shape, "
                       "**encoder_kwargs) with an out_features attribute, one trunk for both heads "
                       "(docs/custom-models.md)", default="auto")
    encoder_kwargs: dict = doc("keyword arguments of your own model.encoder class (plain YAML values)",
                               default_factory=dict)
    grid_convs: list = doc("the grid encoder's convolutions, in order: [channels, kernel] keeps the board's size "
                           "('same' padding: a piece's neighbours are what matter, and a small board has no room to "
                           "stride); [channels, kernel, valid] leaves the padding out, so each output reads one "
                           "kernel x kernel window of the board (connect four: [128, 4, valid], a detector per "
                           "window that every line of four fits in); ReLU after each",
                           default_factory=lambda: [[32, 3], [32, 3]])
    grid_policy: str = doc("the grid encoder's policy head: 'mlp' (a linear layer over the MLP after the "
                           "convolutions, which the critic shares), 'columns' (a logit per board column: a 1x1 "
                           "convolution over the convolutions' map, log-sum-exp down each column; connect four, "
                           "whose actions are its columns), 'landing' (the same convolution's logit of the cell "
                           "a piece dropped in the column lands on, its lowest empty one: gravity games such as "
                           "connect four, where a line that could be made higher up is not yet a move) or "
                           "'cells' (a logit per cell, row-major: tic-tac-toe). "
                           "These read the map itself, so a pattern learned at one place is known at every place; "
                           "the critic then has an MLP of hidden_sizes of its own. They need a map of the board's "
                           "width (columns) or one cell per action (cells): 'same' convolutions. Actor-critic "
                           "algorithms without a recurrent core", range=OneOf(GRID_POLICIES), default="mlp")
    obs_norm: bool = doc("normalise observations by a running mean and variance (clipped to +-10), kept in "
                         "the model, updated by the learners from every update's batch", default=False)
    core: str = doc("'none' (feed-forward), 'lstm' or 'gru': a recurrent core between the encoder and the "
                    "heads (the MLP encoder is then one shared trunk). Policy servers keep each env's hidden "
                    "state and reset it at episode ends; PPO/APPO train each fragment as a sequence "
                    "(truncated BPTT at algo.rollout_length; MAPPO/IPPO: a state per agent row), DQN stored "
                    "sequences (R2D2: algo.dqn.sequence_length, burn_in, sequence_period, priority_eta)",
                    range=OneOf(CORES), default="none")
    core_size: int = doc("hidden size of the recurrent core (model.core: lstm or gru)",
                         range=Range(1, MAX_WIDTH, words=f"1 to {MAX_WIDTH:,}"), default=128)


def validate_model(m: ModelConfig, algo_name: str, trains: str) -> None:
    """Range and choice checks of the model section; `trains`: what algo.name trains (its
    dataflow's policy: 'q', 'sac', 'td3' or an actor-critic's)."""
    check_ranges(m, "model")
    check(isinstance(m.encoder, str) and (m.encoder in ENCODERS or IMPORT_PATH.fullmatch(m.encoder)),
          lambda: f"model.encoder: expected one of {', '.join(ENCODERS)}, or the import path of your own torch "
                  f"module as 'package.module:Class', got {shown(m.encoder)}")
    check(isinstance(m.encoder_kwargs, dict) and all(isinstance(k, str) for k in m.encoder_kwargs),
          lambda: f"model.encoder_kwargs: expected a mapping of keyword arguments, got {shown(m.encoder_kwargs)}")
    check(not m.encoder_kwargs or is_custom(m.encoder),
          f"model.encoder_kwargs: {m.encoder} is a built-in encoder, which takes no keyword arguments; name your own "
          f"class in model.encoder ('package.module:Class'), or remove encoder_kwargs")
    check(not is_custom(m.encoder) or trains not in ("sac", "td3"),
          f"model.encoder: {algo_name} reads its observations with MLPs (its critics take the action beside them); "
          f"your own encoder works with the actor-critic algorithms and DQN; use encoder: mlp")
    check(1 <= len(m.hidden_sizes) <= MAX_LAYERS
          and all(_whole(h, MAX_WIDTH) for h in m.hidden_sizes),
          lambda: f"model.hidden_sizes: expected a list of 1 to {MAX_LAYERS} widths, each 1 to {MAX_WIDTH:,}, "
                  f"got {shown(m.hidden_sizes)}")
    check(1 <= len(m.grid_convs) <= MAX_LAYERS and all(_grid_conv(c) for c in m.grid_convs),
          lambda: f"model.grid_convs: expected a list of 1 to {MAX_LAYERS} convolutions, each [channels, kernel] "
                  f"or [channels, kernel, valid] with channels 1 to {MAX_WIDTH:,} and kernel 1 to {MAX_KERNEL}, "
                  f"got {shown(m.grid_convs)}")
    check(m.grid_policy == "mlp" or (m.encoder == "grid" and m.core == "none"),
          f"model.grid_policy: {m.grid_policy} reads the grid encoder's map, so it needs model.encoder: grid and "
          f"model.core: none (got encoder {m.encoder!r}, core {m.core!r}); or use grid_policy: mlp")
    check(m.grid_policy == "mlp" or trains not in ("q", "sac", "td3"),
          f"model.grid_policy: {m.grid_policy} is an actor-critic's policy head, and {algo_name} trains a "
          f"{'Q-network' if trains == 'q' else 'continuous actor'}; use grid_policy: mlp")


def is_custom(encoder: str) -> bool:
    """Whether model.encoder names the user's own class ('package.module:Class')."""
    return isinstance(encoder, str) and ":" in encoder


def _whole(x: Any, top: int) -> bool:
    """Whether `x` is a whole number from 1 to `top` (a width, a channel count, a kernel)."""
    return isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= top


def _grid_conv(conv: Any) -> bool:
    """Whether `conv` is one of model.grid_convs: [channels, kernel] or [channels, kernel, padding]."""
    return (isinstance(conv, list) and len(conv) in (2, 3) and _whole(conv[0], MAX_WIDTH)
            and _whole(conv[1], MAX_KERNEL) and conv[2:] in ([], ["same"], ["valid"]))
