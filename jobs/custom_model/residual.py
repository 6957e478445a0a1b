"""Your own encoder, worked through (docs/custom-models.md): a small residual CNN over MiniGrid's
observation, a Dict of a 7x7x3 grid of (object, colour, state) codes and the agent's direction.

    model:
      encoder: jobs.custom_model.residual:ResidualGridEncoder
      encoder_kwargs: {channels: 32, blocks: 2, out_features: 128}

hpcrl builds it as `ResidualGridEncoder(input_shape, **encoder_kwargs)`, where input_shape is
{"direction": (), "image": (7, 7, 3)} for MiniGrid, and puts its own policy and value heads on its
`out_features` outputs. Its forward gets the leaves as tensors: the grid as float32 codes
(normalised with model.obs_norm), the direction as int64 ids.
"""
from __future__ import annotations

import torch
from torch import nn


class ResidualBlock(nn.Module):
    """Two 3x3 convolutions and a skip connection (He et al. 2016), keeping the grid's size."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv2(torch.relu(self.conv1(torch.relu(x))))


class ResidualGridEncoder(nn.Module):
    """The grid through a 3x3 stem and `blocks` residual blocks, the direction through an
    embedding, then one linear layer to `out_features`."""

    def __init__(self, input_shape: dict, channels: int = 32, blocks: int = 2, out_features: int = 128):
        super().__init__()
        height, width, codes = input_shape["image"]  # MiniGrid's grid is channel-last
        self.stem = nn.Conv2d(codes, channels, 3, padding=1)
        self.blocks = nn.Sequential(*(ResidualBlock(channels) for _ in range(blocks)))
        self.direction = nn.Embedding(4, 8) if "direction" in input_shape else None
        flat = channels * height * width + (8 if self.direction is not None else 0)
        self.head = nn.Linear(flat, out_features)
        self.out_features = out_features  # what hpcrl's heads read

    def forward(self, obs: dict) -> torch.Tensor:
        x = self.blocks(self.stem(obs["image"].permute(0, 3, 1, 2)))  # [B, H, W, C] -> [B, C, H, W]
        parts = [torch.relu(x).flatten(1)]
        if self.direction is not None:
            parts.append(self.direction(obs["direction"]))
        return torch.relu(self.head(torch.cat(parts, dim=1)))
