"""Tensors kept back to back in one contiguous tensor (an arena), so that a whole group of them
is one buffer for MPI (models/member.py: a population member's state; models/adam.py: its moments)."""
from __future__ import annotations

import numpy as np
import torch


def views_of(tensors: list[torch.Tensor], arena: torch.Tensor | None) -> bool:
    """Whether `tensors` lie back to back in `arena`, in order, filling it."""
    if arena is None:
        return False
    offset = 0
    for t in tensors:
        if not t.is_contiguous() or t.dtype != arena.dtype or t.device != arena.device or \
                t.data_ptr() != arena.data_ptr() + offset * arena.element_size():
            return False
        offset += t.numel()
    return offset == arena.numel()


def arena_for(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    """A zeroed tensor that holds all of `tensors` back to back (one dtype and device)."""
    kinds = {(t.dtype, t.device) for t in tensors}
    if len(kinds) != 1:
        raise ValueError(f"{what} mix dtypes or devices ({sorted(str(k) for k in kinds)}); one arena holds one kind")
    dtype, device = kinds.pop()
    size = sum(t.numel() for t in tensors)
    if device.type == "cpu":
        # numpy's large allocations are advised as transparent huge pages (torch's are not): a
        # 130 MB member state moved between two processes in 10 ms from numpy's memory against
        # 17-20 ms from torch's (Open MPI's single-copy path walks the pages)
        return torch.from_numpy(np.zeros(size, dtype=torch.empty((), dtype=dtype).numpy().dtype))
    return torch.zeros(size, dtype=dtype, device=device)


def pack(tensors: list[torch.Tensor], what: str) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """A new arena holding `tensors`' values back to back, and its views shaped as each of them
    (the caller puts each view where its tensor was)."""
    arena = arena_for(tensors, what)
    views, offset = [], 0
    with torch.no_grad():
        for t in tensors:
            view = arena[offset:offset + t.numel()].view_as(t)
            view.copy_(t)
            views.append(view)
            offset += t.numel()
    return arena, views
