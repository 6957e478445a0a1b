"""A population member's state (weights, normalisers, Adam's moments and step) copied in memory
between two learner groups over real MPI (runtime/member_copy.py), and what refuses a copy."""
import json

import numpy as np
import pytest
import torch

from hpcrl.core.config import ModelConfig
from hpcrl.envs import EnvSpaces
from hpcrl.models import build_model, member_arrays, member_layout
from hpcrl.models.adam import Adam
from hpcrl.runtime.member_copy import MemberState
from tests.conftest import mpirun_script


def test_a_copy_makes_the_target_group_the_source_member_exactly(tmp_path):
    result = mpirun_script(4, "mpi_member_copy.py", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    r = [json.loads((tmp_path / f"rank{i}.json").read_text()) for i in range(4)]
    assert len({x["before"] for x in r}) == 4  # four different members to begin with
    # member B's two learners now hold member A's root state, bit for bit, Adam's step count too
    assert r[2]["after_copy"] == r[3]["after_copy"] == r[0]["after_copy"] == r[0]["before"]
    assert r[2]["adam_step"] == r[3]["adam_step"] == r[0]["adam_step"] == 4.0  # rank 0 took 3 steps, then 1
    assert r[1]["after_copy"] == r[1]["before"]  # A's other learner is untouched by the copy
    # and they go on as one: the same step on the same data gives the same state
    assert r[2]["after_step"] == r[3]["after_step"] == r[0]["after_step"] != r[1]["after_step"]
    assert len({x["fingerprint"] for x in r}) == 1 and r[0]["nbytes"] > 3 * 4 * (64 * 64)


def trained(hidden: list[int]):
    torch.manual_seed(0)
    model = build_model(EnvSpaces((4,), "float32", 2), ModelConfig(hidden_sizes=hidden))
    return model, Adam(model.parameters())


def test_the_state_is_a_few_arenas_that_share_memory_with_the_tensors():
    model, optimizer = trained([8, 8])
    first = next(model.parameters())
    before = first.detach().clone()
    arrays = member_arrays(model, optimizer)  # creates Adam's state before any step
    # the parameters' arena, no buffers (no obs_norm), Adam's steps and two moments
    n = sum(p.numel() for p in model.parameters())
    assert [a.size for a in arrays] == [n, len(list(model.parameters())), n, n]
    assert torch.equal(first, before)  # re-homed, values kept
    arrays[0][0] = 0.5  # writing the array writes the weight: a received copy lands in place
    assert first.view(-1)[0] == 0.5
    loss = sum(p.sum() for p in model.parameters())
    loss.backward()
    optimizer.step()  # steps write into the arenas, which stay where they are
    again = member_arrays(model, optimizer)
    assert all(a.ctypes.data == b.ctypes.data for a, b in zip(arrays, again))
    assert np.all(arrays[1] == 1.0) and np.any(arrays[2] != 0)
    optimizer.load_state_dict(optimizer.state_dict())  # a resume loads into the arenas too
    assert all(a.ctypes.data == b.ctypes.data for a, b in zip(arrays, member_arrays(model, optimizer)))
    state = MemberState(arrays, member_layout(model))
    assert state.nbytes == sum(a.nbytes for a in arrays)
    swapped = trained([16, 8])[0]
    other = MemberState(member_arrays(swapped, Adam(swapped.parameters())), member_layout(swapped))
    assert state.fingerprint() != other.fingerprint()  # a member of another shape cannot take the copy
    # the same bytes laid out as other tensors: the layout, not only the sizes, tells them apart
    assert MemberState(arrays, "a(8, 8)").fingerprint() != MemberState(arrays, "a(4, 16)").fingerprint()
    twin = trained([8, 8])[0]
    assert state.fingerprint() == MemberState(member_arrays(twin, Adam(twin.parameters())),
                                              member_layout(twin)).fingerprint()


def test_a_state_that_is_not_contiguous_is_refused():
    with pytest.raises(ValueError, match="not contiguous"):
        MemberState([np.zeros((4, 4), dtype=np.float32)[:, ::2]])
