"""What every config section shares: the error type for user mistakes, documented fields, and
the check that raises one. Pure Python (every rank and `hpcrl plan` read configs)."""
from __future__ import annotations

from dataclasses import field
from typing import Any


class ConfigError(ValueError):
    """A user mistake in the config; the message says where, what, and what would be valid."""


def doc(text: str, **kwargs: Any) -> Any:
    """A dataclass field with its one-line documentation attached."""
    return field(metadata={"doc": text}, **kwargs)


def check(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)
