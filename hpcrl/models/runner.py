"""Running a policy network for a policy holder, and the weights message that carries it: the
runners (PolicyRunner for actor-critics, models.q:QRunner for Q-networks) answer requests on numpy
batches; the weights message is every parameter, then every buffer, as one float32 vector."""
from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from hpcrl.core.observations import apply
from hpcrl.core.observations import count_rows
from hpcrl.core.seeds import keyed_uniforms

if TYPE_CHECKING:
    from hpcrl.models.networks import ObservationInput


# --- the weights message: parameters, then buffers (the normaliser's stats) ---------------------------

def policy_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Every tensor a policy holder needs, in a fixed order: parameters, then buffers."""
    return [*model.parameters(), *model.buffers()]


def policy_digest(model: nn.Module) -> int:
    """A 64-bit hash of every policy tensor (parameters and normaliser stats), to compare replicas."""
    h = hashlib.blake2b(digest_size=8)
    for t in policy_tensors(model):
        h.update(t.detach().cpu().numpy().tobytes())
    return int(np.frombuffer(h.digest(), dtype=np.int64)[0])


def num_params(model: nn.Module) -> int:
    """Length of the weights message (parameters and normaliser buffers)."""
    return sum(t.numel() for t in policy_tensors(model))


def copy_params_to(model: nn.Module, flat: np.ndarray) -> None:
    """Model tensors -> a preallocated float32 vector (the weights message)."""
    offset = 0
    for t in policy_tensors(model):
        n = t.numel()
        flat[offset:offset + n] = t.detach().reshape(-1).cpu().numpy()
        offset += n


def load_params_from(model: nn.Module, flat: np.ndarray) -> None:
    """A float32 vector (the weights message) -> model tensors, in place."""
    offset = 0
    with torch.no_grad():
        for t in policy_tensors(model):
            n = t.numel()
            t.copy_(torch.from_numpy(flat[offset:offset + n]).view(t.shape))
            offset += n


PLAYS = ("sample", "greedy")

# torch's CPU kernels give other bits for the same rows at another alignment (a block of a request
# that starts 24 bytes into a cache line computes other last bits than the same rows at its start)
ALIGNMENT = 64


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """`t`, or a copy of it where its data does not start on a 64-byte boundary (a view into a
    request at a row's offset): every forward then reads its rows at the same alignment."""
    return t if t.data_ptr() % ALIGNMENT == 0 else t.clone()


class Runner:
    """Runs a policy network forward on numpy batches for a policy holder: `act` fills the reply
    fields named in `outputs` (views into a reply buffer, or a policy server's batch arrays).
    Forwards run under torch.inference_mode, not no_grad: it skips autograd's version counting,
    about a tenth of a small policy's forward on a CPU policy server, and nothing a runner
    computes is ever differentiated.

    `play` (hpcrl eval: a player, not a server of actors): the runner answers with the actions
    alone (`outputs` is ("actions",)), "sample" drawn as a holder draws them, "greedy" the most
    likely ones (an actor-critic's mode; a Q-network's argmax, sampled or not, as exploration is
    the actors')."""

    outputs: tuple[str, ...] = ()

    def __init__(self, model: ObservationInput, device: str, seed: int, play: str | None = None,
                 draw_key: int | None = None):
        """`seed`: the generator's, for calls without keys (hpcrl eval, tests); `draw_key`: the key of
        the draws of calls with keys (a holder's, per policy: the same on every rank; default `seed`)."""
        if play is not None and play not in PLAYS:
            raise ValueError(f"play: expected None or one of {PLAYS}, got {play!r}")
        self.play = play
        if play is not None:
            self.outputs = ("actions",)
        self.device = torch.device(device)
        self.model = model.to(self.device)
        self.model.eval()
        self.version = -1
        # Its own stream: action sampling repeats per seed and can be saved and restored alone.
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.draw_key = seed if draw_key is None else draw_key

    def _uniforms(self, keys: tuple[np.ndarray, np.ndarray] | None) -> torch.Tensor | None:
        """The rows' keyed draws, [rows, draw_width] float64 on the device, for `keys` = (each row's
        global index, its action step); None without keys (the generator draws)."""
        if keys is None:
            return None
        return torch.from_numpy(keyed_uniforms(self.draw_key, keys[0], keys[1], self.model.draw_width)).to(self.device)

    def load(self, flat: np.ndarray, version: int) -> None:
        load_params_from(self.model, flat)
        self.version = version

    def _tensor(self, obs):
        # native dtype: uint8 frames cross to the device as bytes; the model casts to float32
        return apply(lambda leaf: _aligned(torch.as_tensor(leaf, device=self.device)), obs)  # Dict observations: per leaf


class PolicyRunner(Runner):
    """Actor-critic: sampled actions, their log-probs and the state values."""

    outputs = ("actions", "logp", "values")

    @torch.inference_mode()
    def act(self, obs: np.ndarray, out: dict[str, np.ndarray], mask: np.ndarray | None = None,
            state: np.ndarray | None = None, keys: tuple[np.ndarray, np.ndarray] | None = None) -> None:
        """`mask`: each row's valid actions (envs that give action masks). `state` (a recurrent
        policy): the rows' hidden states, [rows, state_size], advanced in place. `keys`: each row's
        (global index, action step), which key its draws (else the runner's generator draws)."""
        mask = None if mask is None else torch.as_tensor(mask, device=self.device).bool()
        if self.play == "greedy":
            self._greedy(obs, out, mask, state)
            return
        uniforms = self._uniforms(keys)
        if not self.model.recurrent:
            a, lp, v = self.model.sample(self._tensor(obs), self.generator, mask, uniforms=uniforms)
        else:  # without `state`, rows without a history (zero states)
            a, lp, v, new = self.model.sample(self._tensor(obs), self.generator, mask,
                                              None if state is None else self._tensor(state), uniforms=uniforms)
            if state is not None:
                state[...] = new.cpu().numpy()
        out["actions"][...] = a.cpu().numpy()
        if self.play is None:
            out["logp"][...] = lp.cpu().numpy()
            out["values"][...] = v.cpu().numpy()

    def _greedy(self, obs: np.ndarray, out: dict[str, np.ndarray], mask: torch.Tensor | None,
                state: np.ndarray | None) -> None:
        """The most likely actions: the valid argmax (categorical), the mean (Gaussian)."""
        if not self.model.recurrent:
            a = self.model.mode(self._tensor(obs), mask)
        else:
            a, new = self.model.mode(self._tensor(obs), mask, None if state is None else self._tensor(state))
            if state is not None:
                state[...] = new.cpu().numpy()
        out["actions"][...] = a.cpu().numpy()

    @torch.inference_mode()
    def value(self, obs: np.ndarray, out: np.ndarray, state: np.ndarray | None = None) -> None:
        """`state` (a recurrent policy): the rows' hidden states, left as they are."""
        if count_rows(obs):
            v = self.model.value(self._tensor(obs)) if state is None else \
                self.model.value(self._tensor(obs), self._tensor(state))
            out[...] = v.cpu().numpy()
