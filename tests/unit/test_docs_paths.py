"""The docs name what exists: every test file and source file a page names is in the
repository, every relative link of a page leads to a file, and the user pages name code
by its module (which a pip install has), never by a checkout path (which it has not).
Cost: well under a second."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PATH = re.compile(r"\b(?:sinks|sources|connectors|tests|scripts|examples)/[\w/]+\.(?:py|sh)\b")
#: a Markdown link's target: ``[text](target)``.
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`(?:sinks|sources|connectors)/[\w/]+\.py`")
#: docs/README.md's user pages (protocol.md is also the connector authors' page).
USER_PAGES = (
    "kafka-source.md",
    "kafka-sink.md",
    "postgres-sink.md",
    "redis-sink.md",
    "change-streams.md",
    "batch-writes.md",
    "deploy.md",
    "operations.md",
    "flink-concepts.md",
    "security.md",
)


def _pages() -> list[Path]:
    """The README and the docs, without docs/bench/'s records of past runs (they name the
    code as it was then)."""
    docs = sorted((ROOT / "docs").rglob("*.md"))
    return [
        ROOT / "README.md",
        *(p for p in docs if "bench" not in p.relative_to(ROOT).parts[1:-1]),
    ]


def test_every_path_a_page_names_exists() -> None:
    missing = [
        f"{page.relative_to(ROOT)}: {path}"
        for page in _pages()
        for path in sorted(set(PATH.findall(page.read_text())))
        if not (ROOT / path).exists()
    ]
    assert not missing, missing


def _anchors(page: Path) -> set[str]:
    """The anchors a page's headings get on GitHub: lower case, punctuation dropped,
    spaces as hyphens (fenced code skipped: a shell comment is no heading)."""
    anchors: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


def test_every_relative_link_leads_to_a_file_and_heading() -> None:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in LINK.findall(page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = page.parent / path if path else page
            if not linked.exists() or (anchor and anchor not in _anchors(linked)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_user_pages_name_code_by_its_module() -> None:
    found = [
        f"{name}: {path}"
        for name in USER_PAGES
        for path in CODE_PATH.findall((ROOT / "docs" / name).read_text())
    ]
    assert not found, found
