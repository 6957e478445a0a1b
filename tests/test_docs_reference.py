"""The documentation is a reference to this repository: every relative link of docs/, the README
and the published results' READMEs lands on a file in the repository, no page links outside it
but to published http(s) references, every file a page names in code exists, the architecture
page stays short enough to read, and the tests page names every test module.

tests/test_docs.py builds the site (anchors, pages) and checks the README's links land on headings;
this checks the files themselves, as a code host or an editor shows them."""
from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

from tests.conftest import REPO

ARCHITECTURE_MAX_LINES = 200  # a page read in one sitting, its drawings included
ARCHITECTURE_MAX_WIDTH = 120  # its drawings and tables read without wrapping

# fenced code blocks and inline code spans hold text, not links
FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n.*?^[ \t]*\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.S)
# [text](target "title"), ![alt](target), [label]: target, <a href=...>, <img src=...>, <scheme:...>
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'|\([^)]*\)))?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^[ ]{0,3}\[[^\]]+\]:[ \t]*(<[^>]*>|\S+)", re.M)
HTML_LINK = re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.I)
AUTOLINK = re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]*)>")
LOCAL_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0", "::1")
# a file named in code: `hpcrl/core/config.py`, `workers/trainer.py` (under hpcrl/), `jobs/x.yaml`
NAMED_FILE = re.compile(r"^[\w.-]+(?:/[\w.-]+)+\.(?:py|md|yaml|yml|sh|sbatch|json|png|h5|txt|toml|c|mp4)$")
# a name to fill in: jobs/results/JOB/README.md, bench/results/NAME.json, env-state/env-IIIII-vVVVVVVV.h5
PLACEHOLDER = re.compile(r"\b(?:JOB|NAME|CONFIG|RUN_DIR|DIR|FILE)\b|([A-Z])\1{2,}")


def pages() -> list[Path]:
    """Every Markdown page a reader is sent to: the site, the README, the published results."""
    return (sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
            + sorted((REPO / "jobs" / "results").glob("*/README.md")))


def _blank(match: re.Match) -> str:
    return re.sub(r"[^\n]", " ", match.group(0))  # keeps the line numbers


def prose(text: str) -> str:
    """The text without its code blocks and code spans, each character of them a space."""
    return CODE_SPAN.sub(_blank, FENCE.sub(_blank, text))


def links(text: str) -> list[tuple[int, str]]:
    """(line, target) of every link of a Markdown text, outside code."""
    text = prose(text)
    found = []
    for pattern in (INLINE_LINK, REFERENCE_DEFINITION, HTML_LINK, AUTOLINK):
        for m in pattern.finditer(text):
            found.append((text.count("\n", 0, m.start()) + 1, m.group(1).strip("<>")))
    return sorted(found)


def link_problem(page: Path, target: str) -> str | None:
    """Why `target`, linked from `page`, is not a file of this repository or a published web page."""
    if target.startswith("#"):
        return None  # a heading of the page itself: the site build checks anchors
    parts = urlsplit(target)
    if parts.scheme or parts.netloc:
        if parts.scheme not in ("http", "https"):
            return f"a {parts.scheme or 'scheme-less'} link: only relative links and http(s) references"
        if (parts.hostname or "") in LOCAL_HOSTS or not parts.hostname:
            return "a link to this machine, which a reader's is not"
        return None
    if target.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:[\\/]", target):
        return "an absolute path: it names a file of one machine, not of the repository"
    path = (page.parent / unquote(parts.path)).resolve()
    if not path.is_relative_to(REPO):
        return f"leaves the repository (to {path})"
    if not path.is_file():
        return "no such file in the repository"
    return None


def named_files(text: str) -> list[tuple[int, str]]:
    """(line, path) of every file path a Markdown text names in inline code."""
    found = []
    for m in CODE_SPAN.finditer(FENCE.sub(_blank, text)):
        name = m.group(2).strip().split(" ")[0].split(":")[0]
        if NAMED_FILE.match(name) and not PLACEHOLDER.search(name):
            found.append((text.count("\n", 0, m.start()) + 1, name))
    return found


def names_a_file(page: Path, name: str) -> bool:
    """A path a page names: from the repository root, from hpcrl/ (`core/layout.py`), or from the
    page's own directory (a job's README naming its plots)."""
    return any((base / name).exists() for base in (REPO, REPO / "hpcrl", page.parent))


def test_every_relative_link_lands_on_a_file_of_the_repository():
    wrong = [f"{page.relative_to(REPO)}:{line}: ({target}) {problem}"
             for page in pages() for line, target in links(page.read_text(encoding="utf-8"))
             if (problem := link_problem(page, target))]
    assert not wrong, "links that do not land in the repository:\n" + "\n".join(wrong)


def test_every_file_a_page_names_in_code_exists():
    """A page that names `workers/trainer.py` or `jobs/x.yaml` sends the reader there: a file that
    was moved or removed is a page out of date."""
    wrong = [f"{page.relative_to(REPO)}:{line}: `{name}`" for page in pages()
             for line, name in named_files(page.read_text(encoding="utf-8")) if not names_a_file(page, name)]
    assert not wrong, "files the documentation names that are not in the repository:\n" + "\n".join(wrong)


def architecture_problems(text: str) -> list[str]:
    """What keeps a page from being the short reference architecture.md must be."""
    lines = text.splitlines()
    problems = [f"{len(lines)} lines, {ARCHITECTURE_MAX_LINES} or more"] if len(lines) >= ARCHITECTURE_MAX_LINES else []
    return problems + [f"line {i}: {len(line)} characters" for i, line in enumerate(lines, 1)
                       if len(line) > ARCHITECTURE_MAX_WIDTH]


def test_architecture_is_a_short_reference():
    problems = architecture_problems((REPO / "docs" / "architecture.md").read_text(encoding="utf-8"))
    assert not problems, "docs/architecture.md:\n" + "\n".join(problems)


def test_the_tests_page_names_every_test_module_and_only_those():
    page = (REPO / "docs" / "tests.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`tests/(test_\w+\.py)`", page))
    present = {p.name for p in (REPO / "tests").glob("test_*.py")}
    assert not present - named, f"docs/tests.md has no row for {sorted(present - named)}"
    assert not named - present, f"docs/tests.md names modules that are gone: {sorted(named - present)}"


def test_the_guards_see_each_kind_of_wrong_link():
    """The checks above, on a page written here: the links and names they must find, and the code
    they must leave alone."""
    text = "\n".join([
        "[design](../../shared/DESIGN.md) and [abs](/work/shared/DESIGN.md) and ![gone](missing.png)",
        "[ok](tests.md) [paper](https://arxiv.org/abs/1707.06347 \"PPO\") [self](#a-heading)",
        "[local](http://127.0.0.1:8000) [file](file:///etc/passwd) <a href=\"../../../x.md\">x</a>",
        "`[in code](../shared/DESIGN.md)` and `shared/DESIGN.md` and `core/layout.py` and `jobs/JOB.yaml`",
        "```",
        "[in a block](../shared/DESIGN.md)",
        "```",
        "[ref]: ../../outside.md",
    ])
    page = REPO / "docs" / "any.md"  # where the text would sit (it is not written there)
    problems = {target: link_problem(page, target) for _, target in links(text)}
    assert set(problems) == {"../../shared/DESIGN.md", "/work/shared/DESIGN.md", "missing.png", "tests.md",
                             "https://arxiv.org/abs/1707.06347", "#a-heading", "http://127.0.0.1:8000",
                             "file:///etc/passwd", "../../../x.md", "../../outside.md"}
    assert {t for t, p in problems.items() if p is None} == {"tests.md", "https://arxiv.org/abs/1707.06347",
                                                            "#a-heading"}
    assert "leaves the repository" in problems["../../shared/DESIGN.md"]  # the design file beside the repository
    assert "absolute path" in problems["/work/shared/DESIGN.md"]
    assert problems["missing.png"] == "no such file in the repository"
    names = [name for _, name in named_files(text)]
    assert names == ["shared/DESIGN.md", "core/layout.py"]  # the link-like one and the placeholder are skipped
    assert not names_a_file(page, "shared/DESIGN.md") and names_a_file(page, "core/layout.py")
    # the old architecture.md's shape: 479 lines, up to 716 characters
    assert architecture_problems("short line\n" * 478 + "x" * 716 + "\n") == [
        "479 lines, 200 or more", "line 479: 716 characters"]
    assert architecture_problems("short line\n" * 199) == []
