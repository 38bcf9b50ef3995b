"""`make demo` runs the local profile, whatever site file a deployment has written into the checkout's site/."""

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.timeout(120)


def demo_environment() -> dict[str, str]:
    """The variables `make demo` exports, read from what make would run (make -n)."""
    shown = subprocess.run(["make", "-n", "demo"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    exported = shown[shown.index("export AIRFLOW_HOME="):].replace("\\\n", " ").split(";")[0]
    words = exported.split()[1:]
    return dict(word.split("=", 1) for word in words if "=" in word)


def test_make_demo_runs_the_local_profile_with_a_site_file_present(tmp_path):
    site = ROOT / "site"
    made_folder, written = not site.exists(), not (site / "gpuflow.yaml").exists()
    if written:  # as docs/gcp.md's step writes it (a deployment's file, if one is there, is left as it is)
        site.mkdir(exist_ok=True)
        (site / "gpuflow.yaml").write_text("profile: gcp\nproject: acme-ml-prod\n")
    try:
        env = {key: value for key, value in os.environ.items() if key != "GPUFLOW_SITE_DIR"}
        probe = ("from gpuflow.paths import default_config_file; from gpuflow.configuration.loading import load_config;"
                 "path = default_config_file('configs/local.yaml'); print(path, load_config(path).profile)")
        without = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
        assert without.stdout.split() == ["site/gpuflow.yaml", "gcp"]  # what a checkout's DAGs read otherwise
        demo = subprocess.run([sys.executable, "-c", probe], env={**env, **demo_environment()}, capture_output=True,
                              text=True, check=True)
        assert demo.stdout.split() == ["configs/local.yaml", "local"]
    finally:
        if written:
            (site / "gpuflow.yaml").unlink()
        if made_folder:
            site.rmdir()
