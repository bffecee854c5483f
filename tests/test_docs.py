"""The documentation holds together: the README stays short, and every relative link in it
and in docs/ leads to a file that exists and, with an anchor, to a heading of that file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# [text](target), the target possibly on the next line; images too.
LINK = re.compile(r"\]\(\s*([^)\s]+)\s*\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks, where a link or a heading means one."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but hyphens dropped (and the
    backticks of code), spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    found: set[str] = set()
    for line in _prose(page.read_text()).splitlines():
        match = re.match(r"^#{1,6} (.+?)#*$", line)
        if match:
            base = slug(match.group(1))
            name, n = base, 0
            while name in found:  # GitHub numbers repeated headings: x, x-1, x-2
                n += 1
                name = f"{base}-{n}"
            found.add(name)
    return found


def relative_links(page: Path) -> list[str]:
    return [
        target
        for target in LINK.findall(_prose(page.read_text()))
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target)  # http:, https:, mailto:
    ]


def test_slugs_are_githubs() -> None:
    assert slug("Concurrent requests: batching and the prompt cache") == (
        "concurrent-requests-batching-and-the-prompt-cache"
    )
    assert slug("Browsers (CORS)") == "browsers-cors"
    assert slug("`make bench`") == "make-bench"
    assert slug("Hub pulls (2026-12-02)") == "hub-pulls-2026-12-02"
    assert slug("What an Admit may cost, whatever the hub holds or answers") == (
        "what-an-admit-may-cost-whatever-the-hub-holds-or-answers"
    )


def test_links_are_found_outside_code_only() -> None:
    assert LINK.findall("see [a](b.md#c) and [GBNF](\nhttps://x/y)") == ["b.md#c", "https://x/y"]
    assert _prose("a\n```\n[x](gone.md)\n# not a heading\n```\nb") == "a\nb"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_leads_somewhere(page: Path) -> None:
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such heading in {dest.relative_to(ROOT)}")
    assert broken == []


def test_the_readme_is_what_a_user_needs_first() -> None:
    """At most 400 lines: the reference lives in docs/, and the README links every page."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400
    linked = {Path(target.partition("#")[0]).name for target in relative_links(ROOT / "README.md")}
    assert sorted(p.name for p in PAGES[1:] if p.name not in linked) == []
