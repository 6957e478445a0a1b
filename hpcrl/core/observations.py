"""Observations as named leaves. A Box observation is one leaf; a Dict or Tuple observation has one
leaf per array (nested keys joined by '.', Tuple positions as numbers: 'image', 'pos.0').

Messages get one field per leaf ('obs', or 'obs.image', 'obs.direction', ...), so structured
observations travel without pickling, and `Message[name]` gives the leaves back as a dict. Code that
moves observations goes through the functions here, which take an array (one leaf) or a dict of
arrays (several) alike: a "tree". Text leaves (MiniGrid's mission) cannot travel as arrays and are
left out with a warning (hpcrl/envs/obs_leaves.py reads a gymnasium space into its leaves). Pure numpy:
env ranks, policy servers and `hpcrl plan` all read this.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Union

import numpy as np

Tree = Union[np.ndarray, dict]


@dataclass(frozen=True)
class Leaf:
    """One array of an observation: its key ('' for a Box observation), shape and dtype name;
    `categories` > 0 for a Discrete leaf (a number in [0, categories), embedded by the model)."""

    key: str
    shape: tuple
    dtype: str
    categories: int = 0


@dataclass(frozen=True)
class ObsLeaves:
    """The leaves of an env's observation, in a fixed order, and the keys left out (text)."""

    leaves: tuple
    dropped: tuple = ()

    @classmethod
    def box(cls, shape: tuple, dtype: str) -> "ObsLeaves":
        return cls((Leaf("", tuple(shape), dtype),))

    @property
    def structured(self) -> bool:
        """A Dict or Tuple observation (several leaves, or one under a key)."""
        return len(self.leaves) != 1 or self.leaves[0].key != ""

    def fields(self, name: str, lead: tuple) -> list:
        """Message fields for observations called `name` with leading axes `lead`: (name, dtype, shape)."""
        return [(field_name(name, leaf.key), leaf.dtype, (*lead, *leaf.shape)) for leaf in self.leaves]

    def flatten(self, obs) -> Tree:
        """An env's (or a vector's) observation -> its tree: the array itself, or the
        leaves by key (nested dicts and tuples flattened, dropped keys left out)."""
        return _select(obs, [leaf.key for leaf in self.leaves]) if self.structured else obs


def zeros(obs: ObsLeaves, lead: tuple) -> Tree:
    """Zero observations with leading axes `lead`: an array, or a dict of leaves (structured)."""
    arrays = {leaf.key: np.zeros((*lead, *leaf.shape), dtype=leaf.dtype) for leaf in obs.leaves}
    return arrays if obs.structured else arrays[""]


def field_name(name: str, key: str) -> str:
    return f"{name}.{key}" if key else name


def _select(obs, keys) -> dict:
    """The leaves `keys` of a nested observation (dicts and tuples flattened to dotted keys)."""
    flat = _flat(obs)
    return {key: flat[key] for key in keys}


def _flat(obs, prefix: str = "") -> dict:
    if isinstance(obs, dict):
        items = obs.items()
    elif isinstance(obs, tuple):
        items = ((str(i), value) for i, value in enumerate(obs))
    else:
        return {prefix: obs}
    out = {}
    for key, value in items:
        out.update(_flat(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


# --- trees: an array, or a dict of arrays by leaf key ------------------------------------------------

def fit(template: Tree, obs) -> Tree:
    """An env's (or a vector's) observation as a tree shaped like `template` (a message's
    observation fields): the array itself, or its leaves by key (nested dicts and tuples
    flattened, keys the template lacks, such as dropped text, left out)."""
    return _select(obs, template) if isinstance(template, dict) else obs


def assign(dst: Tree, src: Tree, index=Ellipsis) -> None:
    """dst[index] = src, leaf by leaf."""
    if isinstance(dst, dict):
        for key, array in dst.items():
            array[index] = src[key]
    else:
        dst[index] = src


def take(tree: Tree, index) -> Tree:
    return {key: array[index] for key, array in tree.items()} if isinstance(tree, dict) else tree[index]


def apply(fn: Callable, tree: Tree) -> Tree:
    return {key: fn(array) for key, array in tree.items()} if isinstance(tree, dict) else fn(tree)


def combine(fn: Callable, trees: list) -> Tree:
    """fn over the same leaf of every tree (np.stack, np.concatenate, ...)."""
    if isinstance(trees[0], dict):
        return {key: fn([t[key] for t in trees]) for key in trees[0]}
    return fn(trees)


def leaves(tree: Tree) -> list:
    """The arrays of a tree: its leaves, or the one array."""
    return list(tree.values()) if isinstance(tree, dict) else [tree]


def count_rows(tree: Tree) -> int:
    """How many rows (envs, agents, samples) a tree of observations holds: its leaves' length."""
    return len(leaves(tree)[0])


def grouped(fields: dict, name: str) -> Tree:
    """Observations `name` from arrays keyed by message field name (a replay's rows): the field
    itself, or the leaves of the fields `name.*` by key."""
    if name in fields:
        return fields[name]
    prefix = name + "."
    return {key[len(prefix):]: value for key, value in fields.items() if key.startswith(prefix)}
