"""The README is a short front door whose links all lead somewhere; the docs site itself is built by `make docs`
(MkDocs --strict: a broken link, anchor or page is an error), which `make test` runs."""

import re

from tests.helpers import ROOT

README = ROOT / "README.md"


def _anchors(page: str) -> set[str]:
    """The anchors MkDocs gives a page's headings (lower case, punctuation dropped, spaces as hyphens)."""
    headings = re.findall(r"^#+ (.+)$", page, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-") for heading in headings}


def test_the_readme_is_at_most_150_lines():
    assert len(README.read_text().splitlines()) <= 150


def test_every_link_in_the_readme_leads_to_a_file_and_heading_of_the_repository():
    links = re.findall(r"\]\(([^)]+)\)", README.read_text())
    assert links
    broken = []
    for link in links:
        path, _, anchor = link.partition("#")
        target = ROOT / path
        if not target.is_file() or (anchor and anchor not in _anchors(target.read_text())):
            broken.append(link)
    assert broken == []


def test_every_docs_page_is_in_the_sites_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(path.name for path in (ROOT / "docs").glob("*.md"))
    assert [page for page in pages if f": {page}" not in nav] == []
