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


def folder_sections() -> dict[str, str]:
    """The map's plugins/gpuflow/ part, cut at each folder's heading ("  steps/   ...") into that folder's text."""
    plugins = map_text().split("plugins/gpuflow/", 1)[1].split("\nbeam_jobs/", 1)[0]
    parts = re.split(r"^  ([a-z_]+)/ ", plugins, flags=re.M)
    return {"": parts[0], **dict(zip(parts[1::2], parts[2::2], strict=True))}


def test_each_folder_of_the_tree_has_its_heading_and_names_its_own_modules():
    """The map follows the tree: one heading per folder of plugins/gpuflow/, and each module named under its own
    folder's heading (a module moved to another folder fails here until the map moves it too)."""
    package = ROOT / "plugins" / "gpuflow"
    sections = folder_sections()
    folders = sorted(p.name for p in package.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert sorted(name for name in sections if name) == folders
    misplaced = [str(path.relative_to(package)) for path in sorted(package.rglob("*"))
                 if path.suffix in (".py", ".json", ".yaml") and path.name != "__init__.py"
                 and "__pycache__" not in path.parts
                 and not re.search(rf"\b{re.escape(path.stem)}\b",
                                   sections["" if path.parent == package else path.parent.name])]
    assert misplaced == []


def test_no_link_leaves_the_repository():
    text = DOC.read_text()
    links = re.findall(r"\]\(([^)]+)\)", text)
    assert [link for link in links if link.startswith(("http:", "https:", "../"))] == []
    assert "../" not in text  # not even a path written out
