"""Encoders of the user's own for the tests (model.encoder: "tests.custom_nets:Class",
docs/custom-models.md): the worked example of jobs/custom_model, small ones, and broken ones.
Importing this module leaves a mark per MPI rank in $HPCRL_TEST_IMPORT_MARKS, so a test can tell
which ranks imported it."""
import os

import torch
from torch import nn

from jobs.custom_model.residual import ResidualGridEncoder  # noqa: F401 (named by the tests' configs)

if os.environ.get("HPCRL_TEST_IMPORT_MARKS"):
    open(os.path.join(os.environ["HPCRL_TEST_IMPORT_MARKS"], f"rank{os.environ.get('OMPI_COMM_WORLD_RANK', '-')}"),
         "w").close()


class TwoLayers(nn.Module):
    """An MLP over flat observations (CartPole's), with a buffer to travel with the weights."""

    def __init__(self, input_shape: tuple, width: int = 32):
        super().__init__()
        (features,) = input_shape
        self.net = nn.Sequential(nn.Linear(features, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.register_buffer("scale", torch.ones(features))
        self.out_features = width

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x * self.scale)


class WrongWidth(TwoLayers):
    """Says 8 outputs, gives 7."""

    def __init__(self, input_shape: tuple):
        super().__init__(input_shape, width=7)
        self.out_features = 8


class NoWidth(nn.Module):
    def __init__(self, input_shape: tuple):
        super().__init__()
        self.net = nn.Linear(input_shape[0], 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class NotAModule:
    def __init__(self, input_shape: tuple):
        self.out_features = 4
