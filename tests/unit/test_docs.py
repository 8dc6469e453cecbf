"""The code cites docs/design.md and docs/broker-notes.md by section anchor: every
cited anchor must exist, and nothing cites documents outside the repository."""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SKIP = {".git", ".venv", "build", "node_modules", "__pycache__"}
CITATION = re.compile(r"docs/(design|broker-notes)\.md#([A-Za-z0-9_-]+)")
LOCAL_LINK = re.compile(r"\]\(((?:design|broker-notes)\.md)?#([A-Za-z0-9_-]+)\)")
OUTSIDE = re.compile(r"DESIGN\.md|BROKER-NOTES|STYLE\.md|/work/shared")


def slug(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: str) -> set[str]:
    lines = (DOCS / page).read_text().splitlines()
    return {slug(line.lstrip("#")) for line in lines if line.startswith("#")}


def sources() -> list[Path]:
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.endswith(".egg-info")]
        for name in files:
            if Path(name).suffix in {".py", ".toml", ".md", ".yml", ".yaml", ".cfg"}:
                out.append(Path(folder) / name)
    return out


def test_every_cited_section_exists():
    known = {page: anchors(f"{page}.md") for page in ("design", "broker-notes")}
    missing = []
    cited = 0
    for path in sources():
        text = path.read_text(errors="replace")
        found = [(m[1], m[2]) for m in CITATION.finditer(text)]
        if path.parent == DOCS:
            for m in LOCAL_LINK.finditer(text):
                page = (m[1] or path.name).removesuffix(".md")
                found.append((page, m[2]))
        for page, anchor in found:
            cited += 1
            if anchor not in known[page]:
                missing.append(f"{path.relative_to(ROOT)}: docs/{page}.md#{anchor}")
    assert cited > 10  # the code does cite them
    assert missing == [], "sections cited but not in docs/: " + ", ".join(missing)


def test_nothing_cites_documents_outside_the_repository():
    stale = [
        f"{path.relative_to(ROOT)}:{n}"
        for path in sources()
        if path != Path(__file__).resolve()
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if OUTSIDE.search(line)
    ]
    assert stale == [], "cite docs/design.md#... or docs/broker-notes.md#... instead: " + ", ".join(
        stale
    )


def test_slugs_follow_github():
    assert slug("Tansu: what is broken") == "tansu-what-is-broken"
    assert slug("The embedded broker (Tansu)") == "the-embedded-broker-tansu"
    assert slug("fastavro: single-object encoding") == "fastavro-single-object-encoding"
