"""Lay gpuflow out as a Cloud Composer environment's bucket, copied as deploy-composer copies it.

``python -m tests.composer_tree DEST`` writes DEST/dags, DEST/plugins/gpuflow and DEST/data/... from
``gpuflow.composer.contents.deploy_files`` (the very list the deploy uploads), plus the tests and their pytest settings,
which Composer never gets. ``make test-composer`` runs the tests there, with only dags/ and plugins/ on
sys.path as Composer has them: a path that works only inside the repository fails.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from gpuflow.composer.contents import deploy_files
from tests.helpers import ROOT


def lay_out(destination: Path) -> Path:
    if destination.exists():
        shutil.rmtree(destination)
    for name, source in deploy_files().items():
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    shutil.copytree(ROOT / "tests", destination / "tests", ignore=shutil.ignore_patterns("__pycache__", "artifacts"))
    shutil.copy2(ROOT / "pyproject.toml", destination / "pyproject.toml")
    return destination


if __name__ == "__main__":
    print(lay_out(Path(sys.argv[1]).resolve()))
