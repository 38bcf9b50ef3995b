"""docs/architecture.md's map names every module of the tree, and no link leaves the repository."""

import re

from tests.helpers import ROOT

DOC = ROOT / "docs" / "architecture.md"


def map_text() -> str:
    return DOC.read_text().split("## Rooms", 1)[1].split("## The walk of one run", 1)[0]


def test_the_map_names_every_dag_and_every_module():
    text = map_text()
    files = [*sorted((ROOT / "dags").glob("*.py")),
             *sorted(p for p in (ROOT / "plugins" / "gpuflow").rglob("*.py") if p.name != "__init__.py")]
    # A module is named by its file name, or by its stem in its folder's list ("steps/  quota, resources, …").
    missing = [str(path.relative_to(ROOT)) for path in files
               if path.name not in text and not re.search(rf"\b{path.stem}\b", text)]
    assert missing == []


def test_no_link_leaves_the_repository():
    text = DOC.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert [link for link in links if link.startswith(("http:", "https:", "../"))] == []
    assert "../" not in text  # not even a path written out
