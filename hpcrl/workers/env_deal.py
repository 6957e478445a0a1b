"""An env rank's state env by env, so a sync run with run.deterministic resumes exactly on another
number of env ranks: each env's state is filed under its global index, and a resumed rank takes the
envs its own global indices name, whichever ranks held them before (hpcrl/io/env_states.py reads
them; docs/reproducibility.md, "An exact resume").

The state of a rank holding the global envs [first, first + n), at a policy version's start:
- `envs`: each env's object graph, as data (hpcrl/envs/state.py): {"tree", "arrays"} per env;
- `rows`: every per-row array of the rank in global row order, named: its groups' observations,
  episode returns and lengths, active rows, action masks, episode starts and an inline recurrent
  policy's hidden states, and the rows of their vectors' layers (hpcrl/envs/per_env.py);
- `steps`: the groups' action step count, which keys their draws (the same in every group).

What this cannot carry leaves the rank's state whole (`why_not`), which a resume restores on the
same layout only: a record writer's own state (replay windows and exploration draws), self-play
seats, and vectors that keep state across envs.
"""
from __future__ import annotations

import numpy as np

from hpcrl.core.observations import count_rows
from hpcrl.envs import per_env, state


def why_not(groups: list, writer_parts: dict | None) -> str:
    """Why this rank's state cannot be split env by env ("" when it can)."""
    if writer_parts:
        return "its record writer keeps state of its own"
    if any(group.seats is not None for group in groups):
        return "its self-play seats are drawn per env rank"
    try:
        for group in groups:
            per_env.split(group.envs)
    except per_env.NotSplittable as exc:
        return str(exc)
    return ""


def _group_rows(group) -> tuple[list, dict[str, np.ndarray]]:
    """A group's envs and its per-row arrays (live: a restore writes into them), by name."""
    rows = {"obs": group.request["obs"], "ep_return": group.ep_return, "ep_length": group.ep_length,
            **group.policy.row_state()}
    if group.active is not None:
        rows["active"] = group.active
    if group.masked:
        rows["action_mask"] = group.request["action_mask"]
    if group.recurrent:
        rows["starts"] = group.request["starts"]
    envs, vector_rows = per_env.split(group.envs)
    rows.update({f"vector.{name}": value for name, value in vector_rows.items()})
    return envs, per_env.row_arrays(rows)


def capture(groups: list) -> dict:
    """The rank's state as data ({"envs", "rows", "steps"}, above); NotCapturable for an env whose
    state is not plain data, NotSplittable for a vector that keeps state across its envs."""
    envs, rows = [], {}
    for group in groups:
        group_envs, arrays = _group_rows(group)
        envs += group_envs
        for name, array in arrays.items():
            rows.setdefault(name, []).append(np.array(array))
    return {"envs": [state.as_record(env) for env in envs], "rows": {name: np.concatenate(parts) for name, parts in rows.items()},
            "steps": groups[0].next_step()}


def restore(groups: list, saved: dict) -> None:
    """Write `saved` (as `capture` gives it, of the rank's envs in order) into the groups' fresh envs
    and arrays, all checked before any is written: StateMismatch (nothing written) if it does not
    fit them."""
    writes, env, row = [], 0, 0
    for group in groups:
        group_envs, arrays = _group_rows(group)
        if set(arrays) != set(saved["rows"]):
            raise state.StateMismatch(f"the saved rows are {sorted(saved['rows'])}, this run's env group has "
                                      f"{sorted(arrays)}")
        for fresh in group_envs:
            if env >= len(saved["envs"]):
                raise state.StateMismatch(f"the saved state holds {len(saved['envs'])} envs, this rank has more")
            piece = saved["envs"][env]
            if piece["tree"] is None:
                raise state.StateMismatch(f"the saved state of the rank's env {env} has no tree")
            writes.append(state.planned_record(fresh, piece))
            env += 1
        n = count_rows(group.request["obs"])
        for name, live in arrays.items():
            rows = saved["rows"][name][row:row + n]
            if rows.dtype != live.dtype or rows.shape != live.shape:
                raise state.StateMismatch(f"rows {name!r}: the saved state holds {rows.dtype} {rows.shape}, this run's "
                                          f"env group has {live.dtype} {live.shape}")
            writes.append(lambda live=live, rows=rows: np.copyto(live, rows))
        row += n
    if env != len(saved["envs"]):
        raise state.StateMismatch(f"the saved state holds {len(saved['envs'])} envs, this rank has {env}")
    for write in writes:
        write()
    for group in groups:
        group.steps = int(saved["steps"])
