"""Every generated file holds what its data gives now (regenerate with `make generate`), and a stale one is found."""

import pytest

from gpuflow.paths import PROJECT_ROOT
from gpuflow.tools.generated import generated_files, markers, with_block


@pytest.mark.parametrize("path", sorted(generated_files()), ids=lambda p: str(p.relative_to(PROJECT_ROOT)))
def test_each_generated_file_is_current(path):
    assert path.read_text() == generated_files()[path], f"{path} is stale: run `make generate`"


def test_a_block_is_replaced_between_its_markers_and_a_page_without_them_is_refused():
    begin, end = markers("recipe table")
    page = f"intro\n{begin}\nold table\n{end}\noutro\n"
    assert with_block(page, "recipe table", "new table") == f"intro\n{begin}\nnew table\n{end}\noutro\n"
    with pytest.raises(ValueError, match="markers"):
        with_block("no markers here", "recipe table", "x")

