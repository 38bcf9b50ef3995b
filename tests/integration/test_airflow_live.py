"""llm_streaming_inference triggered the way a person does: through Airflow 3's REST API, run by the real
scheduler (LocalExecutor) from DAGs parsed by the real dag-processor, on the local profile's emulators."""

from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.live_airflow import USERNAME, LiveAirflow

DAG_ID = "llm_streaming_inference"


@pytest.fixture(scope="module")
def airflow_live(tmp_path_factory, emulators):
    live = LiveAirflow(tmp_path_factory.mktemp("airflow-live"))
    try:
        live.start()
        yield live
    finally:
        live.stop()


def local_conf(local_config):
    local = local_config.local
    return {"local__state_dir": local.state_dir, "local__pubsub_emulator_host": local.pubsub_emulator_host,
            "local__storage_emulator_host": local.storage_emulator_host, "model__max_new_tokens": 8,
            "smoke_test__num_prompts": 4}


def test_a_run_triggered_through_the_rest_api_answers_prompts(airflow_live, local_config):
    dag = airflow_live.wait_for_dag(DAG_ID)
    assert dag["dag_id"] == DAG_ID
    answer = airflow_live.api("POST", f"/dags/{DAG_ID}/dagRuns",
                              json={"logical_date": None, "conf": local_conf(local_config)})
    assert answer.status_code == 200, answer.text
    run_id = answer.json()["dag_run_id"]

    run = airflow_live.wait_for_run(DAG_ID, run_id, timeout_s=900)
    states = {ti["task_id"]: ti["state"] for ti in
              airflow_live.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").json()["task_instances"]}
    assert run["state"] == "success", (states, airflow_live.log_tail("scheduler"))
    assert set(states.values()) == {"success"}

    xcom = airflow_live.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/smoke_test/xcomEntries/"
                                   "return_value", params={"deserialize": True}).json()
    smoke = xcom["value"]
    assert smoke["answered"] == smoke["sent"] == 4
    assert all(row["answer"] for row in smoke["answers"])
    # The UI knows the launch task's extra link (empty on the local profile: no console page).
    links = airflow_live.api("GET", f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/launch/links")
    assert links.status_code == 200 and "Dataflow job" in links.json()["extra_links"], links.text


def test_a_conf_that_breaks_the_params_schema_is_refused(airflow_live, local_config):
    airflow_live.wait_for_dag(DAG_ID)
    answer = airflow_live.api("POST", f"/dags/{DAG_ID}/dagRuns",
                              json={"logical_date": None, "conf": {"gpu__count": "many", "profile": "laptop"}})
    assert answer.status_code == 400, answer.text
    assert "gpu__count" in answer.text or "profile" in answer.text


def test_the_api_refuses_requests_without_a_token(airflow_live):
    import requests

    answer = requests.get(f"{airflow_live.url}/api/v2/dags/{DAG_ID}", timeout=10)
    assert answer.status_code == 401


ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = "/usr/bin/chromium"


def test_the_trigger_form_in_a_browser_shows_our_params_and_starts_a_run(airflow_live, local_config):
    """Headless Debian chromium, driven by Playwright (no browser download): log in, open the trigger form,
    check the Params, trigger, and keep screenshots of the form and of the finished run's grid."""
    from playwright.sync_api import sync_playwright

    from gpuflow.operators import dag_params

    assert Path(CHROMIUM).exists(), "Debian's chromium is missing: `make browser` (or .ci/run) installs it"
    ARTIFACTS.mkdir(exist_ok=True)
    airflow_live.wait_for_dag(DAG_ID)
    params = dag_params(DAG_ID)
    conf = local_conf(local_config)
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{airflow_live.url}/")
            page.get_by_label("Username").fill(USERNAME)
            page.get_by_label("Password").fill(airflow_live.password)
            page.get_by_role("button", name="Sign in").click()
            page.wait_for_url(f"{airflow_live.url}/", timeout=60_000)

            page.goto(f"{airflow_live.url}/dags/{DAG_ID}")
            page.get_by_role("button", name="Trigger").first.click()
            dialog = page.get_by_role("dialog")
            dialog.get_by_text("Run Parameters").wait_for()
            # Every Param renders with its title and its description.
            for key in ("config_file", "profile", "gpu__type", "model__max_new_tokens", "dataflow__stop_action"):
                field = dialog.locator(f"[data-scope=field][data-part=root][role=group]:has([name=element_{key}])")
                assert field.locator("label").inner_text().strip().rstrip("*").strip() == params[key].schema["title"]
                description = params[key].description or params[key].schema.get("description")
                assert field.locator("[data-part=helper-text]").inner_text().strip() == description
            # An enum Param offers exactly its allowed values.
            dialog.locator("#element_profile [role=combobox]").click()
            offered = [option.inner_text() for option in page.get_by_role("option").all()]
            assert {"local", "gcp"} <= set(offered), offered
            dialog.locator("#element_profile [role=combobox]").click()  # closes the menu again
            for key, value in conf.items():
                field = dialog.locator(f"input[name=element_{key}]")
                field.click()
                field.press_sequentially(str(value))
                assert field.input_value() == str(value)
            dialog.screenshot(path=str(ARTIFACTS / "trigger-form.png"))
            runs_before = {r["dag_run_id"] for r in airflow_live.api("GET", f"/dags/{DAG_ID}/dagRuns").json()["dag_runs"]}
            dialog.get_by_role("button", name="Trigger").click()

            run_id = airflow_live.wait_for_new_run(DAG_ID, runs_before)
            run = airflow_live.wait_for_run(DAG_ID, run_id, timeout_s=900)
            assert run["state"] == "success", airflow_live.log_tail("scheduler")
            assert run["conf"]["local__state_dir"] == conf["local__state_dir"]  # the form's values reached the run
            page.goto(f"{airflow_live.url}/dags/{DAG_ID}/runs/{run_id}")
            page.get_by_text("smoke_test").first.wait_for()
            page.wait_for_timeout(2000)
            page.screenshot(path=str(ARTIFACTS / "finished-run-grid.png"), full_page=True)
        finally:
            browser.close()
    assert (ARTIFACTS / "trigger-form.png").stat().st_size > 10_000
    assert (ARTIFACTS / "finished-run-grid.png").stat().st_size > 10_000
