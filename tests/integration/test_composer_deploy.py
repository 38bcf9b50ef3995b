"""deploy-composer against a faked Composer (its environments API and Airflow REST API, at the client boundary
under the provider's CloudComposerHook) and the GCS emulator as the environment's bucket."""

import json

import pytest
from airflow.providers.google.cloud.hooks.gcs import GCSHook

from gpuflow.composer.contents import MANIFEST, deploy_files
from gpuflow.tools.deploy_composer import ComposerDeployment, ComposerTarget, DeployFailed, DeployRefused
from tests.gcp_fakes.composer import FakeComposer
from tests.helpers import GCP_TEST_PROJECT, ROOT, dag_bag

pytestmark = pytest.mark.integration

TARGET = ComposerTarget("shared", "europe-west4", GCP_TEST_PROJECT)


@pytest.fixture
def composer(gcs_bucket, monkeypatch):
    fake = FakeComposer().install(monkeypatch)
    gcs = gcs_bucket(fake.bucket)
    for name in gcs.list(fake.bucket):  # each test starts from an environment gpuflow never touched
        gcs.delete(fake.bucket, name)
    gcs.upload(fake.bucket, "dags/team_etl.py", data="# another team's DAG\n")
    return fake


def deploy(config=None, dry_run=False):
    said = []
    summary = ComposerDeployment(TARGET, say=said.append).deploy(config, dry_run=dry_run)
    return summary, "\n".join(said)


def objects(composer):
    return set(GCSHook(gcp_conn_id="google_cloud_default").list(composer.bucket))


def test_a_dry_run_reads_the_environment_says_what_would_change_and_writes_nothing(composer):
    before = objects(composer)
    summary, said = deploy(dry_run=True)
    assert objects(composer) == before and composer.pools == {}
    assert [type(r).__name__ for r in composer.requests] == ["GetEnvironmentRequest"]
    assert "add google-cloud-artifact-registry>=1.23.0,<2" in said and "raise openai==1.99.0 to openai>=2.54.0,<3" in said
    assert "pool gpuflow_gpu: create it" in said and "dry run: nothing was changed" in said
    assert summary["files"]["copied"] == len(deploy_files())


def test_a_deploy_keeps_every_package_it_did_not_add_and_creates_the_pool(composer):
    deploy()
    assert composer.pypi_packages["pandas-gbq"] == "==0.29.0"  # another team's, kept
    assert composer.pypi_packages["openai"] == ">=2.54.0,<3"  # gpuflow's, raised
    assert composer.pypi_packages["google-cloud-service-usage"] == ">=1.18.0,<2"
    assert not [name for name in composer.pypi_packages if name.startswith(("apache-airflow", "apache-beam"))]
    assert composer.pools["gpuflow_gpu"] == {"name": "gpuflow_gpu", "slots": 1, "include_deferred": True,
                                             "description": "gpuflow: GPU jobs start one at a time"}
    found = objects(composer)
    assert "dags/team_etl.py" in found and set(deploy_files()) <= found and MANIFEST in found
    _, said = deploy()  # again: nothing new to add, the pool is there
    assert "pool gpuflow_gpu: exists" in said and composer.pools["gpuflow_gpu"]["slots"] == 1


def test_a_redeploy_removes_only_gpuflows_own_stale_files(composer):
    gcs = GCSHook(gcp_conn_id="google_cloud_default")
    gcs.upload(composer.bucket, MANIFEST, data=json.dumps(["dags/gpuflow_retired.py", "dags/llm_batch_inference.py"]))
    gcs.upload(composer.bucket, "dags/gpuflow_retired.py", data="# a DAG gpuflow no longer ships\n")
    summary, said = deploy()
    assert summary["files"]["removed"] == ["dags/gpuflow_retired.py"] and "remove dags/gpuflow_retired.py" in said
    found = objects(composer)
    assert "dags/gpuflow_retired.py" not in found and "dags/team_etl.py" in found
    assert json.loads(gcs.download(composer.bucket, MANIFEST)) == sorted(deploy_files())


def writes(composer, before: set[str]) -> dict[str, int]:
    """What a deploy changed: objects uploaded or removed, environment updates sent, pool POSTs."""
    return {"objects": len(objects(composer) ^ before), "updates": composer.events.count("update sent"),
            "pools": composer.events.count("POST /api/v2/pools")}


NONE_WRITTEN = {"objects": 0, "updates": 0, "pools": 0}


@pytest.mark.parametrize("case", ["local-profile config", "image below the floor", "Airflow API unreadable",
                                  "config that fails preflight"])
def test_each_refusal_comes_before_any_write(composer, tmp_path, case):
    """Everything is checked first: the image floor, --config (a gcp file that passes preflight's configuration
    rules), the Airflow REST API; a refusal writes nothing (no object, no update, no pool)."""
    config = None
    if case == "local-profile config":
        config = ROOT / "configs" / "local.yaml"
    elif case == "image below the floor":
        composer.image_version = "composer-3-airflow-3.1.7-build.11"
    elif case == "Airflow API unreadable":
        composer.api_refuses = 403
    else:
        config = tmp_path / "bad.yaml"  # the example's placeholder project, which preflight refuses
        config.write_text((ROOT / "configs" / "gcp.example.yaml").read_text())
    before = objects(composer)
    with pytest.raises(DeployRefused, match="Fix"):
        deploy(config=config)
    assert writes(composer, before) == NONE_WRITTEN and composer.pools == {}


def test_a_deploy_waits_for_the_package_update_before_it_creates_the_pool(composer):
    deploy()
    assert composer.events == ["update sent", "update finished", "POST /api/v2/pools"]


def test_a_failed_package_update_is_reported_with_its_error_and_no_pool_is_made(composer):
    composer.update_error = "Failed to install PyPI packages: openai>=2.54.0,<3 conflicts with team-llm==0.3"
    with pytest.raises(DeployFailed, match=r"package update failed: .*openai>=2\.54\.0,<3 conflicts with team-llm"
                                           r".*keeps the previous package list"):
        deploy()
    assert composer.pypi_packages["openai"] == "==1.99.0"  # Composer kept the previous list
    assert composer.events == ["update sent", "update finished"] and composer.pools == {}


def test_an_image_below_the_floor_is_refused_before_anything_changes(composer):
    composer.image_version = "composer-3-airflow-3.1.7-build.11"  # below the floor, 3.1.8
    before = objects(composer)
    with pytest.raises(DeployRefused, match="--image-version composer-3-airflow-3.3.1-build.10"):
        deploy()
    assert objects(composer) == before and composer.pools == {} and "openai" in composer.pypi_packages
    assert composer.pypi_packages["openai"] == "==1.99.0"


def test_each_teams_configuration_becomes_a_site_with_its_dags_and_a_redeploy_keeps_them(composer, tmp_path):
    from gpuflow.sites import site_dag_file_text

    gcs = GCSHook(gcp_conn_id="google_cloud_default")
    for team in ("acme", "beta"):
        mine = tmp_path / f"{team}.yaml"
        mine.write_text((ROOT / "configs" / "gcp.example.yaml").read_text().replace("my-gcp-project",
                                                                                     f"{team}-ml-prod"))
        summary, said = deploy(config=mine)
        assert summary["config"] == {"config": f"data/site/{team}.yaml", "dag_file": f"dags/{team}/gpuflow_site.py"}
        assert f"site {team}" in said
    deploy()  # no --config: the teams' sites stay
    for team in ("acme", "beta"):
        assert f"{team}-ml-prod" in gcs.download(composer.bucket, f"data/site/{team}.yaml").decode()
        assert gcs.download(composer.bucket, f"dags/{team}/gpuflow_site.py").decode() == site_dag_file_text(
            f"site/{team}.yaml")
    with pytest.raises(DeployRefused, match="profile: gcp"):
        deploy(config=ROOT / "configs" / "local.yaml")
    bad_name = tmp_path / "Team A.yaml"
    bad_name.write_text((tmp_path / "acme.yaml").read_text())
    with pytest.raises(DeployRefused, match="cannot name a site.*Fix: rename the file"):
        deploy(config=bad_name)


def test_on_composer_preflight_fails_at_once_without_the_pool_and_the_deploy_it_names_clears_it(
        composer, monkeypatch, local_config, emulators):
    """A task on Composer knows its environment from Composer's reserved variables and reads the pool through the
    environment's Airflow REST API; the streaming DAG's preflight then fails before anything is created."""
    from gpuflow.composer.api import this_environment
    from gpuflow.operators.airflow_names import AirflowFailException
    from gpuflow.operators.base import validated_config

    assert this_environment("google_cloud_default") is None  # not on Composer: nothing to read
    for name, value in (("COMPOSER_ENVIRONMENT", "shared"), ("COMPOSER_LOCATION", "europe-west4"),
                        ("GCP_PROJECT", GCP_TEST_PROJECT)):
        monkeypatch.setenv(name, value)
    assert this_environment("google_cloud_default") == TARGET
    dags = dag_bag().dags
    config = local_config

    def preflight(dag_id: str, workflow: str) -> None:
        validated_config(config, {"dag": dags[dag_id]}, workflow, dag_id)

    with pytest.raises(AirflowFailException) as refused:
        preflight("llm_streaming_inference", "inference")
    assert "the Airflow pool 'gpuflow_gpu' does not exist" in str(refused.value)
    assert "make deploy-composer ENV=ENVIRONMENT LOCATION=REGION" in str(refused.value)
    preflight("gpuflow_janitor", "maintenance")  # its tasks run in no pool
    deploy()  # the fix as written: make deploy-composer runs this deployment
    preflight("llm_streaming_inference", "inference")
    assert [(method, url.rsplit("/", 1)[1]) for method, url, _ in composer.api_calls][-1] == ("GET", "gpuflow_gpu")


@pytest.mark.parametrize(("change", "expected"), [
    ({"triggerers": 0}, "has no Airflow triggerer"),
    ({"image_version": "composer-3-airflow-3.1.7-build.11"}, "below gpuflow's floor"),
])
def test_on_composer_preflight_refuses_an_environment_without_a_triggerer_or_below_the_floor(
        composer, monkeypatch, local_config, change, expected):
    """Every gpuflow task that waits defers: without a triggerer a run waits for ever. Preflight reads the
    environment it runs in through the Composer hook, and applying the fix it names clears the finding."""
    from gpuflow.operators.airflow_names import AirflowFailException
    from gpuflow.operators.base import validated_config

    for name, value in (("COMPOSER_ENVIRONMENT", "shared"), ("COMPOSER_LOCATION", "europe-west4"),
                        ("GCP_PROJECT", GCP_TEST_PROJECT)):
        monkeypatch.setenv(name, value)
    deploy()  # the pool exists
    dag = dag_bag().dags["llm_streaming_inference"]
    for name, value in change.items():
        setattr(composer, name, value)
    with pytest.raises(AirflowFailException, match=expected) as refused:
        validated_config(local_config, {"dag": dag}, "inference", "llm_streaming_inference")
    assert "--triggerer-count 1" in str(refused.value) or "--image-version" in str(refused.value)
    composer.triggerers, composer.image_version = 1, FakeComposer.image_version  # the fix, as Composer applies it
    validated_config(local_config, {"dag": dag}, "inference", "llm_streaming_inference")



@pytest.mark.parametrize(("raised", "says"), [
    ("NotFound", "Google answered Not Found: 404 Environment projects/p/locations/l/environments/shared not found"),
    ("ServiceUnavailable", "Google could not be reached (ServiceUnavailable"),
])
def test_a_google_error_is_one_message_with_the_fix_and_no_traceback(composer, monkeypatch, capsys, raised, says):
    """A mistyped environment (NotFound) or Google not answering (ServiceUnavailable): one line, no gRPC traceback."""
    from google.api_core import exceptions

    from gpuflow.tools.cli import main

    message = ("Environment projects/p/locations/l/environments/shared not found" if raised == "NotFound"
               else "502:Bad Gateway\ndebug_error_string = \"UNKNOWN:Error received from peer\"")
    composer.get_raises = getattr(exceptions, raised)(message)
    code = main(["deploy-composer", "--environment", "shared", "--location", "europe-west4", "--project",
                 GCP_TEST_PROJECT, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err and "debug_error_string" not in err, err[-3000:]
    assert says in err and "Fix:" in err
