"""The README and docs/ link only to files (and headings) that exist in the repository,
and the README stays a page: the two commands first, under 200 lines."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def links(page: Path) -> list[str]:
    prose = CODE.sub("", FENCE.sub("", page.read_text()))
    return LINK.findall(prose)


def anchors(page: Path) -> set[str]:
    """The anchors a Markdown renderer gives the page's headings."""
    headings = re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.M)
    slugs = set()
    for heading in headings:
        kept = "".join(c for c in heading.lower() if c.isalnum() or c in " -_")
        slugs.add(kept.replace(" ", "-"))
    return slugs


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves_inside_the_repository(page):
    for target in links(page):
        assert not re.match(r"^[a-z][a-z0-9+.-]*:", target), (
            f"{page.name} links outside the repository: {target}"
        )
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.is_file(), f"{page.name}: {target} is not a file in the repository"
        assert resolved.is_relative_to(ROOT), f"{page.name}: {target} leaves the repository"
        if anchor and resolved.suffix == ".md":
            assert anchor in anchors(resolved), f"{page.name}: no heading #{anchor} there"


def test_every_page_in_docs_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "README.md")}
    unlinked = [p.name for p in PAGES[1:] if p.resolve() not in linked]
    assert unlinked == [], "add these to the README's Documentation table"


def test_the_readme_fits_on_a_screen_and_starts_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    first_block = FENCE.search(text)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(0).splitlines()[1:-1]]
    assert commands[:2] == ["make run", "make test"]
