"""Each site file has DAGs of its own (gpuflow.sites, gpuflow.site_dags): its name in their ids and tags, its file
fixed at parse, and a DAG folder that holds site folders has no local DAGs beside them."""

from pathlib import Path

import pytest

from gpuflow.sites import SITE_DAG_FILE, SiteNameError, site_dag_file_text, site_name, write_site_dag_file
from gpuflow.tools.cli import main
from tests.helpers import dag_bag, site_config

pytestmark = pytest.mark.timeout(120)

NAMES = ["gpu_quota_report", "gpuflow_janitor", "llm_batch_inference", "llm_streaming_inference",
         "llm_streaming_teardown"]


@pytest.mark.parametrize("good", ["acme", "team-a", "ml_ops2", "a" * 31])
def test_a_site_is_named_by_its_files_stem(good):
    assert site_name(f"/somewhere/{good}.yaml") == good


@pytest.mark.parametrize("bad", ["Team-A", "2fast", "gcp.example", "team a", "a" * 32, "-x", "ünï"])
def test_a_stem_that_cannot_name_a_site_is_refused_with_the_fix(bad):
    with pytest.raises(SiteNameError, match="cannot name a site.*Fix: rename the file"):
        site_name(f"{bad}.yaml")


def test_two_site_files_give_two_dag_sets_with_their_own_ids_tags_and_files(tmp_path):
    """One DAG folder, two teams: each site's DAGs carry its name and read its file only; the repository's local
    DAGs are not beside them."""
    dags = tmp_path / "dags"
    dags.mkdir()
    (dags / "llm_streaming_inference.py").write_text(Path("dags/llm_streaming_inference.py").read_text())
    files = {team: site_config(f"{team}.yaml", **{"project": f"{team}-ml-prod"}) for team in ("acme", "beta")}
    files["beta"] = site_config("beta.yaml", "configs/dataproc.example.yaml", project="beta-ml-prod",
                                profile="local")  # with a dataproc section: its Dataproc DAG too
    for config_file in files.values():
        write_site_dag_file(Path(config_file), dags)
    bag = dag_bag(dags)
    assert bag.import_errors == {}
    assert sorted(bag.dags) == sorted([*(f"acme__{name}" for name in NAMES),
                                       *(f"beta__{name}" for name in [*NAMES, "dataproc_gpu_batch"])])
    for dag_id, dag in bag.dags.items():
        team = dag_id.split("__")[0]
        assert dag.gpuflow_form.config_file == str(Path(files[team]).resolve()), dag_id
        assert f"site:{team}" in dag.tags and not {f"site:{other}" for other in files if other != team} & set(dag.tags)
        assert dag.params.get_param("config_file").schema["enum"] == [dag.gpuflow_form.config_file]  # shown, fixed


def test_the_site_dag_file_names_its_airflow_modules_and_the_site(tmp_path):
    """The dag-processor pre-imports the airflow.* modules a DAG file names, and Airflow parses only a file that
    says "airflow" and "dag"."""
    text = site_dag_file_text("site/team-a.yaml")
    assert "import airflow.sdk" in text and "airflow.providers.google.cloud.sensors.gcs" in text
    assert "site_dags('site/team-a.yaml')" in text
    with pytest.raises(SiteNameError):
        site_dag_file_text("site/Team A.yaml")


def test_site_dags_writes_the_site_folder_and_refuses_a_bad_file(tmp_path, capsys):
    good = site_config("cli-team.yaml")
    assert main(["site-dags", "--config", good, "--dags-folder", str(tmp_path)]) == 0
    written = tmp_path / "cli-team" / SITE_DAG_FILE
    assert written.read_text() == site_dag_file_text(str(Path(good).resolve()))
    assert "cli-team__" in capsys.readouterr().out
    broken = site_config("broken.yaml", **{"gpu.count": 0})
    assert main(["site-dags", "--config", broken, "--dags-folder", str(tmp_path)]) == 1
    assert "gpu.count" in capsys.readouterr().err and not (tmp_path / "broken").exists()
    renamed = Path(site_config("Bad Name.yaml"))
    assert main(["site-dags", "--config", str(renamed), "--dags-folder", str(tmp_path)]) == 1
    assert "Fix: rename the file" in capsys.readouterr().err
