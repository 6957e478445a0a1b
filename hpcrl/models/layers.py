"""The building blocks of hpcrl's networks: initialised linear layers, MLPs, the Nature CNN, the
running observation normaliser and masked log-softmax. Below every network module
(networks.py, recurrent.py, q.py, structured.py), so none of them imports another back."""
from __future__ import annotations

import math
import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from hpcrl.core.moments import merge_moments
from hpcrl.core.network_shapes import NATURE_CNN, NATURE_CNN_FEATURES, grid_shape, nature_cnn_map

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU}
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)
OBS_NORM_CLIP, OBS_NORM_EPS = 10.0, 1e-8  # as SB3 VecNormalize and gymnasium NormalizeObservation
MASKED_LOGIT = -1e9  # the logit of an invalid action (action masks)
MOMENT_ROWS = 1024  # observations per float64 slice when summing a batch's moments


def _linear(a: int, b: int, gain: float) -> nn.Linear:
    layer = nn.Linear(a, b)
    # Orthogonal init with small policy-head gain: the standard PPO recipe (Andrychowicz et al. 2021).
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(sizes: list[int], activation: type, out_gain: float) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        last = i == len(sizes) - 2
        layers.append(_linear(a, b, out_gain if last else math.sqrt(2)))
        if not last:
            layers.append(activation())
    return nn.Sequential(*layers)


def _nature_cnn(obs_shape: tuple) -> nn.Sequential:
    """conv 32x8x8/4, 64x4x4/2, 64x3x3/1, fc 512, ReLU after each; CleanRL's orthogonal init."""
    channels = obs_shape[0]
    layers: list[nn.Module] = []
    for out, kernel, stride in NATURE_CNN:
        conv = nn.Conv2d(channels, out, kernel, stride)
        nn.init.orthogonal_(conv.weight, math.sqrt(2))
        nn.init.zeros_(conv.bias)
        layers += [conv, nn.ReLU()]
        channels = out
    layers += [nn.Flatten(), _linear(math.prod(nature_cnn_map(obs_shape)), NATURE_CNN_FEATURES, math.sqrt(2)),
               nn.ReLU()]
    return nn.Sequential(*layers)


class ChannelsFirst(nn.Module):
    """[N, H, W, C] boards (PettingZoo's planes come channel-last) as [N, C, H, W] for Conv2d."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.permute(0, 3, 1, 2)


def _grid_cnn(obs_shape: tuple, convs: list, hidden: list[int], activation: type) -> nn.Sequential:
    """The grid encoder: the convolutions of `_grid_convs`, then an MLP of `hidden` ending in its
    activation; orthogonal init."""
    return nn.Sequential(*_grid_convs(obs_shape, convs), nn.Flatten(),
                         _mlp([math.prod(grid_shape(obs_shape, convs)), *hidden], activation, math.sqrt(2)),
                         activation())


def _grid_convs(obs_shape: tuple, convs: list) -> nn.Sequential:
    """Channel-last [H, W, C] boards through the convolutions of model.grid_convs ([channels,
    kernel] with 'same' padding, or [channels, kernel, 'valid']), ReLU after each: the
    [N, channels, H', W'] map of `grid_shape`; orthogonal init."""
    channels = obs_shape[2]
    layers: list[nn.Module] = [ChannelsFirst()]
    for out, kernel, *padding in convs:
        same = padding != ["valid"]
        if same and kernel % 2 == 0:  # an even kernel's 'same' padding is one more after than before
            layers.append(nn.ZeroPad2d(((kernel - 1) // 2, kernel // 2) * 2))
        conv = nn.Conv2d(channels, out, kernel, padding=kernel // 2 if same and kernel % 2 else 0)
        nn.init.orthogonal_(conv.weight, math.sqrt(2))
        nn.init.zeros_(conv.bias)
        layers += [conv, nn.ReLU()]
        channels = out
    return nn.Sequential(*layers)


class SpatialPolicy(nn.Module):
    """A policy head over the grid encoder's [N, C, H, W] map (model.grid_policy): a 1x1
    convolution gives each cell a logit; 'cells' keeps one per cell (row-major, as tic-tac-toe
    numbers its squares), 'columns' takes the log-sum-exp down each column (a piece dropped in a
    column lands on one of its cells: connect four), 'landing' takes the logit of the cell where it
    lands, the column's lowest empty one, read from the board's taken cells that `LandingMap`
    appends as the map's last channel. The same weights read every place, so a pattern learned in
    one column is known in all."""

    def __init__(self, channels: int, mode: str):
        super().__init__()
        self.conv = nn.Conv2d(channels, 1, 1)
        nn.init.orthogonal_(self.conv.weight, 0.01)  # a near-uniform first policy, as _linear's policy heads
        nn.init.zeros_(self.conv.bias)
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.mode == "landing":
            x, taken = x[:, :-1], x[:, -1]
            # Pieces stack from the bottom (row 0 is the top), so a column's empty cells are its top
            # ones and the lowest of them is row (empty - 1); a full column's (masked) reads row 0.
            row = ((1.0 - taken).sum(dim=1) - 1.0).clamp(min=0).long()
            return self.conv(x)[:, 0].gather(1, row.unsqueeze(1)).squeeze(1)
        logits = self.conv(x)[:, 0]
        return torch.logsumexp(logits, dim=1) if self.mode == "columns" else logits.flatten(1)


class LandingMap(nn.Module):
    """model.grid_policy landing: the grid encoder's map of [N, H, W, C] boards with the board's
    taken cells (any plane set) as one more channel, for SpatialPolicy to find where a piece
    dropped in each column lands (the critic reads it as well)."""

    def __init__(self, convs: nn.Sequential):
        super().__init__()
        self.convs = convs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        taken = (x.abs().sum(dim=-1) > 0).to(x.dtype)
        return torch.cat([self.convs(x), taken.unsqueeze(1)], dim=1)


class RunningNorm(nn.Module):
    """Running mean and variance (Chan et al.'s parallel merge of count, mean and M2) of
    observations (model.obs_norm) or of return targets (algo.value_norm); normalises to
    (x - mean) / sqrt(var + eps), clipped to +-`clip` (None: not clipped). Stats are float64
    buffers; the forward casts them to float32 first, so a policy holder that received them as
    float32 in the weights message normalises bit-identically to the learner."""

    def __init__(self, obs_shape: tuple, clip: float | None = OBS_NORM_CLIP):
        super().__init__()
        self.clip = clip
        # count starts at 0, not SB3's 1e-4: the first merge then gives the batch's exact moments
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(obs_shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(obs_shape, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean, var = self.mean.float(), self.var.float()
        y = (x - mean) / torch.sqrt(var + OBS_NORM_EPS)
        return y if self.clip is None else y.clamp(-self.clip, self.clip)

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        return y * torch.sqrt(self.var.float() + OBS_NORM_EPS) + self.mean.float()

    @torch.no_grad()
    def moments(self, x: torch.Tensor) -> np.ndarray:
        """[n, sum(x - m), sum((x - m)^2)] of a batch, flat float64, around the current mean m (a
        shift every learner shares, which keeps the sums accurate). Moments of several batches add."""
        shift = self.mean.flatten()
        s1, s2 = torch.zeros_like(shift), torch.zeros_like(shift)
        for rows in x.flatten(1).split(MOMENT_ROWS):  # float64 in slices: frame batches stay small
            d = rows.double() - shift
            s1 += d.sum(0)
            s2 += (d * d).sum(0)
        return torch.cat([shift.new_tensor([x.shape[0]]), s1, s2]).cpu().numpy()

    @torch.no_grad()
    def merge(self, moments: np.ndarray) -> None:
        """Fold (summed) batch moments from `moments` into the running stats."""
        m = torch.from_numpy(np.asarray(moments, dtype=np.float64)).to(self.mean.device)
        size = self.mean.numel()
        n, s1, s2 = m[0], m[1:1 + size].view_as(self.mean), m[1 + size:].view_as(self.mean)
        if n <= 0:
            return
        batch_mean = self.mean + s1 / n  # the same shift moments() used
        batch_m2 = (s2 - s1 * s1 / n).clamp_min(0.0)
        mean, var, count = merge_moments(self.mean, self.var, self.count, batch_mean, batch_m2, n)
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(count)


def _masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Log-probabilities over the valid actions only: invalid ones get probability exactly 0 (a
    logit of -1e9: exp underflows to 0 while the log-probability stays finite, so 0 * logp is 0 in
    the entropy, not NaN). A row with no valid action (an inactive agent) keeps every action."""
    if mask is None:
        return F.log_softmax(logits, dim=-1)
    mask = mask | ~mask.any(-1, keepdim=True)
    return F.log_softmax(logits.masked_fill(~mask, MASKED_LOGIT), dim=-1)
