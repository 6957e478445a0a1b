"""Serial-mode env state as data: JSON text and numpy arrays, never pickle (a run
directory is data, never code).

`capture(obj)` walks a live object graph (the env vector, its sub-envs and wrappers, through
`vars()`) and records its plain data: None, bool, int, float, str, numpy arrays and scalars,
lists, tuples, deques and dicts of those, numpy Generators (their `bit_generator.state`), and
the attributes of any object with a `__dict__`, recursively. What the config rebuilds identically
is recorded only as a marker and left alone on restore: spaces, env specs, enums, dtypes, frozen
dataclasses, classes, modules and callables (the vector's env factories). An object with a
`capture_state()` / `restore_state(tree)` pair is recorded by its hook instead (the ALE emulator,
hpcrl/envs/atari.py). Anything else that holds state (a MuJoCo MjData, a Box2D world, a pygame
surface, an envpool pool) raises NotCapturable, naming where it sits.

`restore(obj, tree, arrays)` never creates objects nor imports anything the data names: the run
builds fresh envs from its own config, exactly as a new run does, and restore walks those fresh
objects alongside the saved tree, writing saved values only where the fresh graph holds the same
kind of thing (an object of the same class, a container of the same type, an array of the same
dtype and shape, a Generator). Any mismatch raises StateMismatch before anything is written.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import json
import types

import gymnasium as gym
import numpy as np

SCALARS = (type(None), bool, int, float, str)
# rebuilt identically from the config: recorded as a marker, never restored
CONFIG = (gym.Space, gym.envs.registration.EnvSpec, enum.Enum, np.dtype, type, types.ModuleType,
          types.FunctionType, types.BuiltinFunctionType, types.MethodType, functools.partial)


class NotCapturable(TypeError):
    """The object graph holds state that is not plain data and offers no capture hook."""


class StateMismatch(ValueError):
    """The saved tree does not fit the fresh objects (another env, or another version of it)."""


def _type_name(value) -> str:
    return f"{type(value).__module__}.{type(value).__qualname__}"


def _is_config(value) -> bool:
    if isinstance(value, CONFIG):
        return True
    params = getattr(type(value), "__dataclass_params__", None)
    return params is not None and params.frozen  # an immutable value (ObsLeaves, EnvConfig)


# the instance size of a class written in Python: a larger one keeps state in C (an envpool pool,
# a pybind11 or nanobind object with a __dict__ on the side) or in __slots__, out of vars()' sight
_PYTHON_OBJECT_SIZE = type("_Plain", (), {}).__basicsize__


def _python_object(value) -> bool:
    return hasattr(value, "__dict__") and type(value).__basicsize__ == _PYTHON_OBJECT_SIZE


def _has_hook(value) -> bool:
    return callable(getattr(value, "capture_state", None)) and callable(getattr(value, "restore_state", None))


# --- capture -------------------------------------------------------------------------------------

def capture(obj) -> tuple[str, dict[str, np.ndarray]]:
    """(JSON text, arrays by key) recording the plain state of `obj`; NotCapturable if some of it
    is not plain data."""
    arrays: dict[str, np.ndarray] = {}
    tree = _Capture(arrays).value(obj, "state")
    return json.dumps(tree), arrays


def as_record(obj) -> dict:
    """`capture` as the record a file stores: {"tree": the JSON text as uint8, "arrays": {key: array}};
    NotCapturable as capture."""
    tree, arrays = capture(obj)
    return {"tree": np.frombuffer(tree.encode(), dtype=np.uint8), "arrays": arrays}


class _Capture:
    def __init__(self, arrays: dict):
        self.arrays = arrays
        self.array_keys: dict[int, str] = {}  # id -> key: an array reached twice is one array on restore
        self.objects: dict[int, str] = {}  # id -> path: an object reached twice is walked once

    def array(self, value: np.ndarray, path: str) -> str:
        if value.dtype.kind not in "biufc":  # what HDF5 stores as numbers (not objects, strings, dates)
            raise NotCapturable(f"{path}: an array of dtype {value.dtype}")
        key = self.array_keys.get(id(value))
        if key is None:
            key = self.array_keys[id(value)] = f"{len(self.arrays):04d}"
            self.arrays[key] = np.array(value)  # a copy: the env steps on
        return key

    def value(self, value, path: str):
        if isinstance(value, SCALARS):
            return value
        if isinstance(value, np.ndarray):
            return {"$array": self.array(value, path)}
        if isinstance(value, np.generic):
            return {"$scalar": self.array(np.asarray(value), path)}
        if isinstance(value, list):
            return [self.value(v, f"{path}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, (tuple, collections.deque)):
            kind = "$tuple" if isinstance(value, tuple) else "$deque"
            return {kind: [self.value(v, f"{path}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            for k in value:
                if not isinstance(k, SCALARS):
                    raise NotCapturable(f"{path}: a dict keyed by {type(k).__name__}")
            return {"$dict": [[k, self.value(v, f"{path}[{k!r}]")] for k, v in value.items()]}
        if isinstance(value, np.random.Generator):
            return {"$generator": self.value(value.bit_generator.state, f"{path}.bit_generator.state")}
        if _is_config(value):
            return {"$config": _type_name(value)}
        if id(value) in self.objects:  # shared, or a cycle: the fresh graph shares it the same way
            return {"$seen": self.objects[id(value)]}
        self.objects[id(value)] = path
        if _has_hook(value):
            return {"$hook": _type_name(value), "state": self.value(value.capture_state(), f"{path}.capture_state()")}
        if not _python_object(value):
            raise NotCapturable(f"{path}: a {_type_name(value)} holds state that is not plain data")
        return {"$object": _type_name(value),
                "vars": {name: self.value(v, f"{path}.{name}") for name, v in vars(value).items()}}


# --- restore -------------------------------------------------------------------------------------

def restore(obj, tree: str, arrays: dict[str, np.ndarray]) -> None:
    """Write the state `capture` recorded into `obj`, a freshly built graph of the same classes.
    StateMismatch (and nothing written) if the saved state does not fit it."""
    planned(obj, tree, arrays)()


def planned_record(obj, record: dict):
    """`planned` from a record of `as_record` (read back from a file); StateMismatch as planned,
    UnicodeDecodeError or TypeError for a tree that is not text."""
    tree = np.asarray(record.get("tree"), dtype=np.uint8).tobytes().decode()
    return planned(obj, tree, record.get("arrays") or {})


def planned(obj, tree: str, arrays: dict[str, np.ndarray]):
    """`restore`'s checks, made now, and its writes as a call to make later: one who restores
    several graphs checks them all before writing any. StateMismatch if the state does not fit."""
    plan = _Restore(arrays)
    try:
        plan.value(obj, json.loads(tree), "state")
    except (ValueError, RecursionError) as exc:  # StateMismatch is a ValueError
        if isinstance(exc, StateMismatch):
            raise
        raise StateMismatch(f"the saved env state is not a tree restore can read ({type(exc).__name__})") from None
    return lambda: [write() for write in plan.writes]


class _Restore:
    """Plans the writes: `value(fresh, saved, path)` returns what the fresh graph should hold at
    `path` and queues every in-place change, so a mismatch found late changes nothing."""

    def __init__(self, arrays: dict):
        self.arrays = arrays
        self.writes: list = []
        self.made: dict[str, np.ndarray] = {}  # saved key -> the array standing for it
        self.claimed: set[int] = set()  # fresh arrays already overwritten with some saved key

    def fail(self, path: str, saved: str, fresh) -> StateMismatch:
        return StateMismatch(f"{path}: the checkpoint holds {saved}, this run's env has {_describe(fresh)}")

    def saved_array(self, key, path: str) -> np.ndarray:
        array = self.arrays.get(key) if isinstance(key, str) else None
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "biufc":
            raise StateMismatch(f"{path}: the saved env state names an array {key!r} it does not hold")
        return array

    def value(self, fresh, saved, path: str):
        if isinstance(saved, SCALARS):
            if fresh is None or isinstance(fresh, (*SCALARS, np.generic, np.ndarray)) and np.ndim(fresh) == 0 \
                    or saved is None and _plain(fresh):
                return saved
            raise self.fail(path, repr(saved), fresh)
        if isinstance(saved, list):
            return self.items(fresh, list, saved, path)
        if not isinstance(saved, dict) or len(saved) != 1 and "$object" not in saved and "$hook" not in saved:
            raise StateMismatch(f"{path}: the saved env state has an entry of no known kind")
        kind, content = next(iter(saved.items()))
        if kind == "$array":
            return self.array(fresh, self.saved_array(content, path), content, path)
        if kind == "$scalar":
            array = self.saved_array(content, path)
            if fresh is not None and not isinstance(fresh, (*SCALARS, np.generic)):
                raise self.fail(path, f"a {array.dtype} scalar", fresh)
            return array[()]
        if kind in ("$tuple", "$deque"):
            return self.items(fresh, tuple if kind == "$tuple" else collections.deque, content, path)
        if kind == "$dict":
            return self.dict(fresh, content, path)
        if kind == "$generator":
            if not isinstance(fresh, np.random.Generator):
                raise self.fail(path, "a numpy Generator", fresh)
            state = self.value(None, content, path)
            if not isinstance(state, dict) or state.get("bit_generator") != fresh.bit_generator.state["bit_generator"]:
                raise self.fail(path, f"a Generator state {str(state)[:60]}", fresh)
            self.writes.append(lambda: setattr(fresh.bit_generator, "state", state))
            return fresh
        if kind in ("$config", "$seen"):
            return fresh
        if kind == "$hook":
            if _type_name(fresh) != saved["$hook"] or not _has_hook(fresh):
                raise self.fail(path, f"the state of a {saved['$hook']}", fresh)
            state = self.value(None, saved["state"], f"{path}.restore_state()")
            self.writes.append(lambda: fresh.restore_state(state))
            return fresh
        if kind == "$object":
            return self.object(fresh, saved, path)
        raise StateMismatch(f"{path}: the saved env state has an entry of unknown kind {kind!r}")

    def array(self, fresh, array: np.ndarray, key: str, path: str):
        """Into the fresh array where it is the same dtype and shape (others may share it), else a copy."""
        if key in self.made:
            return self.made[key]
        if isinstance(fresh, np.ndarray):
            if fresh.dtype != array.dtype or fresh.shape != array.shape:
                raise self.fail(path, f"a {array.dtype} array of shape {array.shape}", fresh)
            if fresh.flags.writeable and id(fresh) not in self.claimed:
                self.claimed.add(id(fresh))
                self.writes.append(lambda: np.copyto(fresh, array))
                self.made[key] = fresh
                return fresh
        elif fresh is not None:
            raise self.fail(path, f"a {array.dtype} array of shape {array.shape}", fresh)
        self.made[key] = array.copy()
        return self.made[key]

    def items(self, fresh, kind: type, saved: list, path: str):
        """A list, tuple or deque: item by item against the fresh one's items where the lengths
        agree, else as plain data only (a queue that has grown holds no objects to write into)."""
        if fresh is not None and not isinstance(fresh, kind):
            raise self.fail(path, f"a {kind.__name__}", fresh)
        if fresh is not None and len(fresh) == len(saved):
            items = [self.value(f, s, f"{path}[{i}]") for i, (f, s) in enumerate(zip(fresh, saved))]
        else:
            try:
                items = [self.value(None, s, f"{path}[{i}]") for i, s in enumerate(saved)]
            except StateMismatch:
                raise StateMismatch(f"{path}: the checkpoint holds {len(saved)} items that are not all plain data, "
                                    f"this run's env {_describe(fresh)}") from None
        if kind is tuple or fresh is None:
            return tuple(items) if kind is tuple else kind(items)
        if kind is list:
            self.writes.append(lambda: fresh.__setitem__(slice(None), items))
        else:
            self.writes.append(lambda: (fresh.clear(), fresh.extend(items)))
        return fresh

    def dict(self, fresh, saved: list, path: str):
        if fresh is not None and not isinstance(fresh, dict):
            raise self.fail(path, "a dict", fresh)
        content = {}
        for entry in saved:
            if not (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[0], SCALARS)):
                raise StateMismatch(f"{path}: the saved env state has a malformed dict entry")
            key, value = entry
            content[key] = self.value(None if fresh is None else fresh.get(key), value, f"{path}[{key!r}]")
        if fresh is None:
            return content
        self.writes.append(lambda: (fresh.clear(), fresh.update(content)))
        return fresh

    def object(self, fresh, saved: dict, path: str):
        """An object of the class the saved one had: each saved attribute into the one it already has."""
        if fresh is None or _type_name(fresh) != saved["$object"] or not _python_object(fresh) \
                or _is_config(fresh) or _has_hook(fresh):
            raise self.fail(path, f"a {saved['$object']}", fresh)
        attributes = vars(fresh)
        saved_vars = saved.get("vars")
        if not isinstance(saved_vars, dict):
            raise StateMismatch(f"{path}: the saved env state has a malformed object entry")
        for name, value in saved_vars.items():
            # an attribute set after construction (PettingZoo's _skip_agent_selection) comes back
            # as plain data only, and never hides what the class defines (a method, a property)
            if name not in attributes and hasattr(type(fresh), name):
                raise StateMismatch(f"{path}.{name}: the checkpoint holds an attribute where this run's "
                                    f"{type(fresh).__name__} has a class attribute")
            new = self.value(attributes.get(name), value, f"{path}.{name}")
            if name not in attributes or new is not attributes[name]:
                self.writes.append(functools.partial(setattr, fresh, name, new))
        return fresh


def _plain(value) -> bool:
    """A value restore may replace by None: data, not an object it would have to rebuild."""
    return isinstance(value, (*SCALARS, np.generic, np.ndarray, list, tuple, collections.deque, dict))


def _describe(value) -> str:
    if isinstance(value, (list, tuple, collections.deque)):
        return f"{len(value)} items"
    if isinstance(value, np.ndarray):
        return f"a {value.dtype} array of shape {value.shape}"
    return "None" if value is None else f"a {_type_name(value)}"
