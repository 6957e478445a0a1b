"""docs/config.md is generated from hpcrl/core/config.py and cannot drift from it."""
import dataclasses

from hpcrl.core.config import Config
from hpcrl.tools.docs import COMMAND, config_reference
from tests.conftest import REPO


def test_committed_config_reference_is_current():
    committed = (REPO / "docs" / "config.md").read_text(encoding="utf-8")
    assert committed == config_reference(), f"docs/config.md is out of date: run `{COMMAND}` and commit it"


def test_every_config_key_is_in_the_reference_with_its_doc():
    text = config_reference()

    def keys(obj, prefix):  # a section's plain keys first, then its nested sections, as the reference
        fields = dataclasses.fields(obj)
        for f in fields:
            if not dataclasses.is_dataclass(getattr(obj, f.name)):
                yield f"{prefix}.{f.name}" if prefix else f.name, f.metadata["doc"]
        for f in fields:
            if dataclasses.is_dataclass(getattr(obj, f.name)):
                yield from keys(getattr(obj, f.name), f"{prefix}.{f.name}" if prefix else f.name)

    rows = [line for line in text.splitlines() if line.startswith("| `")]
    found = list(keys(Config(), ""))
    assert len(rows) == len(found)
    for (name, doc), row in zip(found, rows):
        assert row.startswith(f"| `{name}` |") and row.endswith(f"| {doc.replace('|', chr(92) + '|')} |")
    assert "| `run.total_frames` | an integer | `100000` |" in text
    assert "| `roles.env.ranks` | an integer or a string or null | `rest` |" in text  # resolved default
