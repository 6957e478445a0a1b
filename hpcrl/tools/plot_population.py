"""`hpcrl plot POPULATION_DIR`: a population's members side by side: each member's
learning curve against its own frames, with its exploits marked (where it took another member's
state, and whose), and the hyperparameters explore gave it, against the same frames.

The lineage is the population's metrics.h5 (core/population.py, LINEAGE_KEYS); the curves are
each member's own metrics.h5. No MPI and no torch.
"""
from __future__ import annotations

import os

import numpy as np

from hpcrl.core.config_population import MAX_MEMBERS
from hpcrl.core.league import member_roles
from hpcrl.core.population import EXPLOIT, LINEAGE_KEYS, RESTART, exploits_taken
from hpcrl.io.metrics import read_metrics
from hpcrl.io.rundir import METRICS_FILE
from hpcrl.tools.inspect import RunDirError, load_config_dict

MAX_HYPER_PANELS = 3


def is_population(path: str) -> bool:
    """Whether `path` is a population's directory (its config.yaml has population.members)."""
    try:
        population = load_config_dict(path).get("population")
    except RunDirError:
        return False
    return isinstance(population, dict) and bool(population.get("members"))


def league_roles(pop_dir: str) -> list[str]:
    """Each member's role in a league (core/league.py), from the population's config.yaml (data);
    [] outside a league, or where the counts are not whole numbers."""
    league = (load_config_dict(pop_dir).get("population") or {}).get("league") or {}
    counts = [league.get(k, 0) for k in ("main", "main_exploiters", "league_exploiters")]
    if not all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= MAX_MEMBERS for c in counts):
        return []
    return member_roles(*counts)


def member_dirs(pop_dir: str) -> list[str]:
    """The member directories in a population's directory, in member order."""
    return sorted(d.path for d in os.scandir(pop_dir) if d.is_dir() and d.name.startswith("member"))


def load_lineage(pop_dir: str) -> dict[str, np.ndarray]:
    """The population's lineage, checked to be what hpcrl writes; RunDirError otherwise."""
    path = os.path.join(pop_dir, METRICS_FILE)
    try:
        table = read_metrics(path)
    except FileNotFoundError:
        raise RunDirError(f"{pop_dir!r} holds no {METRICS_FILE} yet (the population root writes it at the start)"
                          ) from None
    except (OSError, KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise RunDirError(f"cannot read {path!r}: {type(exc).__name__}: {exc}") from None
    missing = [k for k in LINEAGE_KEYS if k not in table]
    if missing:
        raise RunDirError(f"{path!r} is not a population's lineage: it has no series {', '.join(missing)}")
    if any(v.ndim != 1 or not np.issubdtype(v.dtype, np.number) for v in table.values()):
        raise RunDirError(f"{path!r}: every lineage series is one number a row, as hpcrl writes it")
    rows = min(len(v) for v in table.values())
    return {k: v[:rows] for k, v in table.items()}


def explored_keys(lineage: dict[str, np.ndarray]) -> list[str]:
    """The hyperparameters that differ between members or change over the run."""
    keys = []
    for key in sorted(k for k in lineage if k.startswith("algo.")):
        values = lineage[key][np.isfinite(lineage[key])]
        if len(values) and values.min() != values.max():
            keys.append(key)
    return keys


def plot_population(pop_dir: str, output: str, metric: str | None = None, smoothing: float = 0.0) -> list[str]:
    """Draw the members' curves and explored hyperparameters into `output`; returns the member
    directories drawn."""
    from hpcrl.tools.plot import check_output, load_curve, smooth
    check_output(output)
    import matplotlib.pyplot as plt
    lineage = load_lineage(pop_dir)
    members = sorted({int(m) for m in lineage["member"]})
    dirs = member_dirs(pop_dir)
    if len(dirs) != len(members):
        raise RunDirError(f"{pop_dir!r}: the lineage names {len(members)} members, the directory holds "
                          f"{len(dirs)} member directories")
    curves = [load_curve(d, metric) for d in dirs]
    keys = explored_keys(lineage)[:MAX_HYPER_PANELS]
    fig, axes = plt.subplots(1, 1 + len(keys), figsize=(6 * (1 + len(keys)), 4.5), squeeze=False)
    ax = axes[0][0]
    exploits = np.flatnonzero(lineage["event"] == EXPLOIT)
    taken = set(exploits_taken(lineage["event"], lineage["member"], lineage["parent"]).tolist())
    restarts = np.flatnonzero(lineage["event"] == RESTART)  # a league's: from a main agent's snapshot
    exploits = np.sort(np.concatenate([exploits, restarts]))
    taken |= set(restarts.tolist())
    roles = league_roles(pop_dir)
    drawn = [smooth(curve.values, smoothing) for curve in curves]
    for m, curve in zip(members, curves):
        label = f"member {m}" + (f" ({roles[m].replace('_', ' ')})" if m < len(roles) else "")
        ax.plot(curve.frames, drawn[m], color=f"C{m % 10}", label=label, lw=1.2)
    for i in exploits:  # where the member took another's state: a marker in its colour, on its drawn curve,
        m, frames = int(lineage["member"][i]), lineage["frames"][i]  # the parent's number above
        y = np.interp(frames, curves[m].frames, drawn[m])
        ax.plot(frames, y, marker="v", color=f"C{m % 10}" if i in taken else "none", markeredgecolor="black", ms=7)
        ax.annotate(str(int(lineage["parent"][i])), (frames, y), textcoords="offset points", xytext=(0, 6),
                    ha="center", fontsize=7)
    ax.set_xlabel("frames (the member's own)")
    ax.set_ylabel(curves[0].metric)
    late = f"; {len(exploits) - len(taken)} hollow: came after the member stopped" if len(taken) < len(exploits) else ""
    if roles:  # a league copies no member; with restart 'main' an exploiter starts again from a main's snapshot
        ax.set_title("league: v, an exploiter's start again from main agent N's snapshot"
                     if len(restarts) else
                     "league: the exploiters start again from their initial weights after snapshots",
                     fontsize="medium")
    else:
        ax.set_title(f"{len(taken)} exploits (v: took the state of the member numbered{late})", fontsize="medium")
    ax.legend(loc="best", fontsize="small")
    for ax, key in zip(axes[0][1:], keys):
        for m in members:
            rows = lineage["member"] == m
            ax.step(lineage["frames"][rows], lineage[key][rows], where="post", color=f"C{m % 10}")
        values = lineage[key][np.isfinite(lineage[key])]
        if values.min() > 0 and values.max() / values.min() > 10:
            ax.set_yscale("log")
        ax.set_xlabel("frames (the member's own)")
        ax.set_ylabel(key)
        ax.set_title(f"{key} after each judgement", fontsize="medium")
    for ax in axes[0]:
        ax.grid(alpha=0.3)
    fig.suptitle(f"population {os.path.basename(os.path.normpath(pop_dir))}: {len(members)} members")
    fig.tight_layout()
    fig.savefig(output, dpi=100)
    plt.close(fig)
    return dirs
