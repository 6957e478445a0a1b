"""The input of a network whose observations are a Dict or Tuple (core/observations.py): each leaf
is cast, scaled, normalised and encoded by a module chosen for it, and the codes are concatenated.

- a Discrete leaf: a learned embedding of EMBEDDING_WIDTH numbers (core/network_shapes.py);
- a uint8 image large enough for the Nature CNN (channel-first [C, H, W], H and W >= 36):
  scaled to [0, 1], then the CNN;
- anything else (vectors, small grids such as MiniGrid's 7x7x3 codes): flattened, as numbers.
With model.obs_norm every leaf that is not Discrete has its own running normaliser, and a batch's
moments of all of them are summed over the learners in one reduction.
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import torch
from torch import nn

from hpcrl.core.network_shapes import EMBEDDING_WIDTH, leaf_code
from hpcrl.core.observations import ObsLeaves


class StructuredInput(nn.Module):
    """Observations as a dict of leaf tensors -> [B, width] features."""

    def __init__(self, obs: ObsLeaves, obs_norm: bool, encode: bool = True):
        """`encode` False: no encoder of its own (the user's own model.encoder reads the leaves:
        `leaves`)."""
        from hpcrl.models.layers import RunningNorm, _nature_cnn
        super().__init__()
        self.encodes = encode
        self.keys = [leaf.key for leaf in obs.leaves]
        self.names = [f"leaf{i}" for i in range(len(obs.leaves))]  # module names cannot hold '.'
        self.kinds, encoders, norms, self.width = [], {}, {}, 0
        for name, leaf in zip(self.names, obs.leaves):
            kind, width = leaf_code(leaf)
            if not encode:
                pass
            elif kind == "discrete":
                encoders[name] = nn.Embedding(leaf.categories, EMBEDDING_WIDTH)
            elif kind == "image":
                encoders[name] = _nature_cnn(leaf.shape)
            else:
                encoders[name] = nn.Identity()  # the numbers themselves, one row each (forward flattens)
            if obs_norm and kind != "discrete":
                norms[name] = RunningNorm(leaf.shape)
            self.kinds.append(kind)
            self.width += width
        self.encoders = nn.ModuleDict(encoders)
        self.norms = nn.ModuleDict(norms)

    def scaled(self, obs: dict) -> dict:
        """Leaf tensors as the encoders read them (before normalising): ids as integers, images in
        [0, 1], everything else as float32 numbers."""
        out = {}
        for key, name, kind in zip(self.keys, self.names, self.kinds):
            x = obs[key]
            out[name] = x.long() if kind == "discrete" else x.float() * (1.0 / 255.0) if kind == "image" else x.float()
        return out

    def leaves(self, obs: dict) -> dict:
        """Each leaf by its key as the user's own encoder reads it: `scaled`, then normalised
        (model.obs_norm)."""
        return {key: self.norms[name](x) if name in self.norms else x
                for key, (name, x) in zip(self.keys, self.scaled(obs).items())}

    def forward(self, obs: dict) -> torch.Tensor:
        codes = []
        for (name, x), kind in zip(self.scaled(obs).items(), self.kinds):
            if name in self.norms:
                x = self.norms[name](x)
            code = self.encoders[name](x)
            codes.append(code.reshape(code.shape[0], -1) if kind == "numbers" else code)  # a scalar leaf too
        return torch.cat(codes, dim=-1)

    def update_norms(self, obs: dict, reduce: Callable[[np.ndarray], np.ndarray]) -> None:
        """Fold a batch into every leaf's normaliser, the moments of all leaves summed in one `reduce`."""
        if not len(self.norms):
            return
        x = self.scaled(obs)
        parts = [self.norms[name].moments(x[name].reshape(x[name].shape[0], -1)) for name in self.norms]  # scalars too
        summed = reduce(np.concatenate(parts))
        start = 0
        for name, part in zip(self.norms, parts):
            self.norms[name].merge(summed[start:start + len(part)])
            start += len(part)
