"""The config reference (docs/config.md), generated from the config dataclasses: every key with its
type, default and meaning, as declared once in hpcrl/core/config.py and its config_*.py sections.

    hpcrl config-reference -o docs/config.md

tests/test_docs.py checks that the committed file equals what this generates.
"""
from __future__ import annotations

import dataclasses
from typing import get_type_hints

import yaml

from hpcrl.core.config import Config, _type_name, resolve
from hpcrl.core.dataflow import readers

COMMAND = "hpcrl config-reference -o docs/config.md"


def _default(value) -> str:
    """A default as it would be written in the YAML config."""
    return "`" + yaml.safe_dump(value, default_flow_style=True, width=1_000).strip().removesuffix("...").strip() + "`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _range(f: dataclasses.Field) -> str:
    """A key's declared range, as its error message says it (core/config_base.py Range)."""
    wanted = f.metadata.get("range")
    return f". Expected: {wanted.expected()}" if wanted is not None else ""


def _readers(f: dataclasses.Field) -> str:
    """For an algo key only some algorithms read: which (a config that sets it for another is refused)."""
    groups = f.metadata.get("reads", ())
    return f". Read by {', '.join(readers(groups))} only" if groups else ""


def _sections(obj, prefix: str, what: str, out: list[str]) -> None:
    """One table per dataclass: its plain keys; nested dataclasses get their own section after it."""
    fields = dataclasses.fields(obj)
    plain = [f for f in fields if not dataclasses.is_dataclass(getattr(obj, f.name))]
    nested = [f for f in fields if dataclasses.is_dataclass(getattr(obj, f.name))]
    if plain:
        title, about = ((f"`{prefix}`", f"{what[:1].upper()}{what[1:]}. {type(obj).__doc__.strip()}") if prefix else
                        ("Top-level keys", "Keys of the config itself, beside its sections."))
        out += [f"## {title}", "", about, "", "| key | type | default | meaning |", "|---|---|---|---|"]
        types = get_type_hints(type(obj))
        for f in plain:
            meaning = f.metadata["doc"] + _range(f) + _readers(f)
            out.append(f"| `{prefix + '.' if prefix else ''}{f.name}` | {_cell(_type_name(types[f.name]))} | "
                       f"{_cell(_default(getattr(obj, f.name)))} | {_cell(meaning)} |")
        out.append("")
    for f in nested:
        _sections(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name, f.metadata["doc"], out)


def config_reference() -> str:
    """The Markdown text of docs/config.md."""
    cfg = Config()
    resolve(cfg)  # defaults as a run resolves them (e.g. each role's rank count)
    out = ["# Config reference", "",
           f"<!-- Generated from hpcrl/core/config.py by `{COMMAND}`; do not edit by hand. -->", "",
           "Every key of the rank-role YAML config, with its type, its default and its meaning. Keys are "
           "written as `section.key`; in YAML they nest (`run: {total_frames: 20000}`), and on the command "
           "line `--set run.total_frames=20000` overrides one. A run writes its resolved config, every default "
           "filled in, to `config.yaml` in its run directory. YAML reads `3e-4` and `1e6` as text (it wants a "
           "dot and a signed exponent): write `3.0e-4` and `1.0e+6`, or `1000000`.", ""]
    _sections(cfg, "", "", out)
    return "\n".join(out).rstrip() + "\n"
