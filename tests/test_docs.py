"""The documentation cannot rot: docs/config.md is generated from hpcrl/core/config.py and cannot
drift from it; the site (mkdocs.yml over docs/) builds in strict mode, so no link, anchor or page
is broken; and the README stays a short entrance whose links land on real pages and headings."""
import dataclasses
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

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
        assert row.startswith(f"| `{name}` |") and f"| {doc.replace('|', chr(92) + '|')}" in row
    assert "| `run.total_frames` | an integer | `100000` |" in text
    assert "| PPO ratio clipping epsilon. Expected: a number > 0. Read by ppo, mappo, ippo only |" in text  # its range, its readers
    assert "| `roles.env.ranks` | an integer or a string or null | `rest` |" in text  # resolved default


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site as `mkdocs build --strict` writes it, outside the repository."""
    out = tmp_path_factory.mktemp("site")
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")  # Material's end-of-life banner, not a build warning
    run = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                          str(REPO / "mkdocs.yml"), "--site-dir", str(out)],
                         capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    return out, run


def test_site_builds_in_strict_mode_without_a_warning(site):
    out, run = site
    log = run.stdout + run.stderr
    assert run.returncode == 0, log
    assert not [line for line in log.splitlines() if line.startswith(("WARNING", "ERROR"))], log
    pages = sorted(p.relative_to(REPO / "docs").with_suffix(".html") for p in (REPO / "docs").rglob("*.md"))
    assert pages and all((out / page).is_file() for page in pages)


class _Blocks(HTMLParser):
    """The text of every paragraph and list item of a page, each block's lines apart."""

    def __init__(self):
        super().__init__()
        self.blocks: list[str] = []
        self.depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in ("p", "li"):
            self.blocks.append("")
            self.depth += 1

    def handle_endtag(self, tag):
        if tag in ("p", "li"):
            self.depth -= 1

    def handle_data(self, data):
        if self.depth:
            self.blocks[-1] += data


def test_no_numbered_list_falls_apart_into_plain_text(site):
    """A list item's continuation indented by 3 spaces (enough for GitHub, not for MkDocs' Markdown)
    ended the list: '2. Judgement.' was a line of plain text in a paragraph (issue 46, item 12)."""
    out, _ = site
    broken = []
    for page in sorted(out.glob("*.html")):
        blocks = _Blocks()
        blocks.feed(page.read_text(encoding="utf-8"))
        broken += [f"{page.name}: {line.strip()[:60]}" for block in blocks.blocks for line in block.splitlines()
                   if re.match(r"\s*\d+\.\s+\S", line)]
    assert not broken, broken


def test_names_in_table_cells_do_not_break_mid_word(site):
    """Keys such as run.total_frames wrapped inside the word in narrow columns: the site's own
    stylesheet keeps code in table cells whole, and every page links it."""
    out, _ = site
    css = (out / "stylesheets" / "extra.css").read_text(encoding="utf-8")
    rule = css[css.index(".md-typeset table:not([class]) td code"):]
    assert "white-space: nowrap" in rule.split("}")[0]
    assert all("stylesheets/extra.css\"" in page.read_text(encoding="utf-8") for page in out.glob("*.html"))


class _Ids(HTMLParser):
    def __init__(self):
        super().__init__()
        self.ids = set()

    def handle_starttag(self, tag, attrs):
        self.ids.update(value for name, value in attrs if name == "id")


README_LINK = re.compile(r"\]\((?!https?:)([^)#\s]+)(?:#([^)\s]+))?\)")


def test_readme_links_land_on_pages_and_headings_of_the_site(site):
    out, _ = site
    links = README_LINK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert links
    for target, anchor in links:
        assert (REPO / target).exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert target.startswith("docs/") and target.endswith(".md"), target
            page = out / Path(target).relative_to("docs").with_suffix(".html")
            ids = _Ids()
            ids.feed(page.read_text(encoding="utf-8"))
            assert anchor in ids.ids, f"README.md links to {target}#{anchor}: no such heading"


def test_readme_is_a_short_entrance_that_names_every_job():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 250
    assert "make demo" in readme and "make test" in readme  # .ci/run calls the README's test command
    jobs_page = (REPO / "docs" / "running.md").read_text(encoding="utf-8")
    for job in sorted((REPO / "jobs").glob("*.yaml")):
        row = f"| `{job.name}`"
        assert row in readme, f"README.md's table of jobs lacks {job.name}"
        assert row in jobs_page, f"docs/running.md's table of jobs lacks {job.name}"
