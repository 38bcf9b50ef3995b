"""The offline image check: each lock installs, as pip would inside its image, for its platform and Python.

It reaches PyPI (uv, dry run, metadata only); no Docker engine and no image are involved."""

import pytest

from gpuflow.images.locks import LockError, lock_names, lock_path, resolve_lock
from gpuflow.tools.cli import main

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.mark.parametrize("name", ["cpu", "cuda12", "export", "vllm"])
def test_each_lock_resolves_for_its_image_and_installs_what_it_pins(name):
    assert lock_names() == ["cpu", "cuda12", "export", "vllm"]
    resolution = resolve_lock(name)
    installed = {line.split("==")[0] for line in resolution.would_install}
    assert "transformers" in installed
    assert ("torch" in installed) == (name != "export")  # the export runs on its image's own torch


def test_a_lock_missing_a_dependency_does_not_resolve(tmp_path, monkeypatch):
    import re

    from gpuflow.images import locks as image_locks

    text = lock_path("export").read_text()
    without_tqdm = re.sub(r"(?m)^tqdm==[^\n]*\n(    [^\n]*\n)*", "", text)
    assert without_tqdm != text
    (tmp_path / "export.lock").write_text(without_tqdm)
    monkeypatch.setattr(image_locks, "LOCKS_DIR", tmp_path)
    with pytest.raises(LockError, match="tqdm"):
        resolve_lock("export")


def test_the_cli_checks_every_lock(capsys):
    assert main(["images", "check"]) == 0
    out = capsys.readouterr().out
    assert "cuda12: resolves for Python 3.11 on x86_64-manylinux_2_28" in out
    assert "export: resolves for Python 3.10" in out
