"""Everything gpuflow writes from its own data, in one map from file to current text: the configuration reference
and the trigger form's schema (from the configuration model), docs/gcp.md's project needs (from
catalog/access.yaml) and docs/gpus.md's recipe table (from the image locks).

`make generate` (dev/generate.py) writes them; tests/unit/test_generated.py fails when one is stale. A block inside
a hand-written page lies between its two markers, which stay.
"""

from __future__ import annotations

import json
from pathlib import Path

from gpuflow.paths import PROJECT_ROOT

DOCS = PROJECT_ROOT / "docs"


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- generated: {name}, by `make generate`; do not edit by hand -->", f"<!-- end of {name} -->")


def with_block(page: str, name: str, content: str) -> str:
    """The page with its block ``name`` replaced by ``content``."""
    begin, end = markers(name)
    if begin not in page or end not in page:
        raise ValueError(f"the page lacks the markers {begin!r} and {end!r}")
    start, stop = page.index(begin) + len(begin), page.index(end)
    return page[:start] + "\n" + content.rstrip("\n") + "\n" + page[stop:]


def generated_files() -> dict[Path, str]:
    """Each generated file, with the text it should have now."""
    from gpuflow.images.containers import recipe_table
    from gpuflow.runs.trigger_form import PARAMS_SCHEMA_FILE
    from gpuflow.tools.access_docs import project_needs_markdown
    from gpuflow.tools.config_docs import configuration_reference, params_json_schema

    gcp, gpus = DOCS / "gcp.md", DOCS / "gpus.md"
    return {
        DOCS / "configuration.md": configuration_reference(),
        PARAMS_SCHEMA_FILE: json.dumps(params_json_schema(), indent=2) + "\n",  # field order: the model's
        gcp: with_block(gcp.read_text(), "project needs", project_needs_markdown()),
        gpus: with_block(gpus.read_text(), "recipe table", recipe_table()),
    }
