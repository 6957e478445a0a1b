"""MkDocs hook: the repository files that the pages link to outside docs/ (a job's results README
and its plots under jobs/results/) are carried into the site, under repo/, so that a link works on
the site as it does in the repository. A carried Markdown page is rendered, and the files it links
to are carried in turn; carried pages stay out of the navigation. Named in mkdocs.yml (`hooks`)."""
from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")  # inline links and images: ](target) or ](target#anchor)
SITE_FOLDER = "repo/"


def on_files(files, config):
    docs = Path(config.docs_dir).resolve()
    repo = docs.parent
    pages = [posixpath.relpath(p, docs) for p in sorted(docs.rglob("*.md"))]
    carried: set[str] = set()
    while pages:
        page = pages.pop()
        for target in LINK.findall((docs / page).read_text(encoding="utf-8")):
            if "://" in target or target.startswith(("/", "mailto:")):
                continue
            uri = posixpath.normpath(posixpath.join(posixpath.dirname(page), target))
            path = (docs / uri).resolve()
            # docs/ is MkDocs' own (a link into it from a carried page stays a warning), and a missing
            # file or one outside the repository is left for MkDocs and tests/test_docs_reference.py
            if uri in carried or not path.is_file() or path.is_relative_to(docs) or not path.is_relative_to(repo):
                continue
            carried.add(uri)
            dest = SITE_FOLDER + path.relative_to(repo).as_posix()
            if uri.endswith(".md"):
                dest = dest[:-len(".md")] + ".html"
                pages.append(uri)
            files.append(File(uri, str(docs), config.site_dir, config.use_directory_urls, dest_uri=dest,
                              inclusion=InclusionLevel.NOT_IN_NAV))
    return files
