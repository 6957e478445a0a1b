"""What `hpcrl tune` writes and prints: the comment block at the top of a tuned config (what was
measured, what is predicted, what bounds it), and on the terminal that block and the best layouts.
"""
from __future__ import annotations

import os
import time

from hpcrl.core.config_sac import replay_settings
from hpcrl.tools.tune.measure import replays
from hpcrl.tools.tune.model import Prediction
from hpcrl.tools.tune.search import Choice


def header(config_path: str, points: dict, best: Choice, shipped: Prediction | None, nodes: int,
           ranks_per_node: int, cores: float, gpus_per_node: int = 0, source: str = "") -> str:
    """The comment block of a tuned config: what was measured, what is predicted, what bounds it."""
    p = best.prediction
    gpus = f", {gpus_per_node} GPU(s)" if gpus_per_node else ""
    lines = [f"tuned by hpcrl tune from {config_path} for {nodes} node(s) x {ranks_per_node} ranks "
             f"({cores:g} cores{gpus}) on {os.uname().nodename}, {time.strftime('%Y-%m-%d %H:%M')}",
             f"measured (CPU seconds on one core{', wall seconds on a GPU' if 'update_cuda' in points else ''}"
             f"{source or ' of this machine'}):"]
    update = "rows" if replays(best.cfg) else "frames"
    for name, (xs, ys) in points.items():
        unit = {"actor_step": "envs", "forward": "rows", "update": update, "insert": "rows", "message": "bytes",
                "averaging": "learners", "forward_cuda": "rows", "update_cuda": update}[name]
        what = {"update": "update (a gradient step)" if replays(best.cfg) else "update",
                "averaging": "averaging (wall seconds added to a gradient step)"}.get(name, name)
        lines.append(f"  {what} " + ", ".join(f"{x:,} {unit}: {y * 1e6:,.0f} us" for x, y in zip(xs, ys)))
    L, I, E = best.counts
    a = best.cfg.algo
    (d, where) = replay_settings(a)
    batch = (f"{where}.batch_size {d.batch_size:,} ({d.batch_size // L:,} per learner)" if replays(best.cfg)
             else f"algo.batch_frames {a.batch_frames:,}")
    on = {role: " on GPUs" if getattr(best.cfg.roles, role).device == "cuda" else "" for role in ("learner", "inference")}
    lines.append(f"chosen: {L} learner{on['learner']}, {I} inference{' (inline)' if not I else on['inference']}, "
                 f"{E} env ranks x "
                 f"{best.cfg.env.num_envs} envs in {best.cfg.env.groups} group(s); {batch}")
    lines.append(f"predicted: {p.frames_per_s:,.0f} frames/s, bound by {p.bound}; each role alone: "
                 + ", ".join(f"{r} {v:,.0f}" for r, v in p.per_role.items()))
    if replays(best.cfg):
        ratio = "algo.replay.replay_ratio" if a.replay.replay_ratio is not None else "predicted, Ape-X"
        lines.append(f"predicted: {p.gradient_steps_per_s:,.1f} gradient steps/s, replay ratio {p.replay_ratio:,.2f} "
                     f"({ratio})")
    if shipped is not None:
        lines.append(f"the config's own layout, predicted: {shipped.frames_per_s:,.0f} frames/s, bound by {shipped.bound}")
    return "".join(f"# {line}\n" for line in lines)


def summary(text: str, ranked: list[Choice], top: int) -> str:
    """What the command prints: the tuned config's header (`text`'s comment lines) without its
    comment marks, then the `top` best of the `ranked` layouts (fastest first)."""
    lines = [line[2:] for line in text.splitlines() if line.startswith("# ")]
    lines.append(f"the {min(top, len(ranked))} best of {len(ranked)} layouts (learner, inference, env ranks; envs per "
                 f"env rank, groups; g: on GPUs): predicted frames/s, bound")
    for ch in ranked[:top]:
        L, I, E = ch.counts
        gpu = {role: "g" if getattr(ch.cfg.roles, role).device == "cuda" else " " for role in ("learner", "inference")}
        lines.append(f"  {L:>4}{gpu['learner']} {I:>4}{gpu['inference']} {E:>6}   {ch.cfg.env.num_envs:>4} x "
                     f"{ch.cfg.env.groups}   {ch.prediction.frames_per_s:>12,.0f}   {ch.prediction.bound}")
    return "".join(line + "\n" for line in lines)
