"""llm_batch_inference on the gcp profile under dag.test(), with Google Cloud's control planes faked (as in
test_dag_gcp.py): the input and outputs on the GCS emulator, every Dataflow job staged by Beam for real, the batch
job run to its end by the fake Dataflow's "workers" on the DirectRunner."""

import json

import pendulum
from airflow.utils.state import DagRunState, TaskInstanceState

from gpuflow.configuration.loading import load_config
from gpuflow.runs.batch_templates import fill_batch_paths
from gpuflow.runs.naming import run_prefix
from tests.gcp_fakes import BATCH_SUCCEEDS, ZONE_EXHAUSTED, FakeDataflow, FakeGoogleCloud, FakeVertex, FakeWorkers
from tests.helpers import GCP_TEST_PROJECT, run_dag, site_config

DAG_ID = "llm_batch_inference"
BUCKET = "gpuflow-gcp-batch-bucket"
DAY = pendulum.datetime(2026, 3, 1, tz="UTC")
CONF = {
    # The project, bucket, model and fallbacks are the site's (a run's conf may set knobs only: gpuflow.runs.run_policy).
    "config_file": site_config("gcp-batch.yaml", "configs/gcp.example.yaml", project=GCP_TEST_PROJECT, bucket=BUCKET,
                               **{"model.name": "google/flan-t5-small", "gpu.fallbacks": [{"region": "us-east4"}],
                                  "dataflow.poll_interval_s": 0.05, "limits.min_poll_interval_s": 0.01}),
    "model__max_new_tokens": 8,
    "require_gpu": False,  # the DirectRunner "workers" of the fake Dataflow run on this CPU
    "batch__input_wait_s": 0,
    "launch__mode": "direct",  # Airflow's Beam stages the templates this test reads (the gcp default is flex_template)
}


def test_a_batch_date_on_gcp_falls_back_from_an_exhausted_zone_and_publishes(airflow_db, gcs_bucket, gcp_env,
                                                                             monkeypatch, tmp_path, demo_model_dir):

    gcs = gcs_bucket(BUCKET)
    lines = [json.dumps({"id": f"q{i}", "prompt": f"tell me about river {i}"}) for i in range(3)] + ["{oops"]
    gcs.upload(BUCKET, "prompts/2026-03-01/part-0.jsonl", data="\n".join(lines) + "\n")
    config = fill_batch_paths(load_config(CONF["config_file"], CONF), {"ds": "2026-03-01"})
    workers = FakeWorkers(config, gcp_env, tmp_path)
    cloud = FakeGoogleCloud(dataflow=FakeDataflow(workers), vertex=FakeVertex(gcp_env, demo_model_dir))
    cloud.install(monkeypatch)
    cloud.dataflow.scripts = [BATCH_SUCCEEDS, ZONE_EXHAUSTED, BATCH_SUCCEEDS]  # GPU check; batch job; its fallback

    from tests.task_trace import TaskFileTrace

    trace = TaskFileTrace().install(monkeypatch)
    run = run_dag(DAG_ID, CONF, logical_date=DAY)

    states = {ti.task_id: ti.state for ti in run.get_task_instances()}
    assert run.state == DagRunState.SUCCESS, states
    assert trace.unnamed(DAG_ID) == {}  # docs/architecture.md's rows name what each task ran (the fallback too)
    assert set(states.values()) == {TaskInstanceState.SUCCESS}
    prefix = run_prefix(run.dag_id, run.run_id)
    launches = cloud.dataflow.calls("launch_template")
    assert [(r.location, r.launch_parameters.job_name) for r in launches] == [
        ("us-central1", f"{prefix}-gpu-check-us-central1-l4"),
        ("us-central1", f"{prefix}-llm-batch-us-central1-l4"),
        ("us-east4", f"{prefix}-llm-batch-us-east4-l4")]
    assert cloud.dataflow.staged[launches[-1].gcs_path]["type"] == "JOB_TYPE_BATCH"
    answers = gcs.download(BUCKET, "answers/2026-03-01/responses.jsonl").decode().splitlines()
    assert sorted(json.loads(line)["id"] for line in answers) == ["q0", "q1", "q2"]
    (letter,) = [json.loads(line) for line in gcs.download(BUCKET, "dead_letters/2026-03-01/dead_letters.jsonl")
                 .decode().splitlines()]
    assert letter["reason"] == "invalid_json" and letter["prompt"] == "{oops"
    summary = json.loads(gcs.download(BUCKET, "answers/2026-03-01/_SUCCESS"))
    assert (summary["lines_in"], summary["answered"], summary["dead_lettered"]) == (4, 3, 1)
    ti = {t.task_id: t for t in run.get_task_instances()}
    assert ti["check_gpu_usage"].xcom_pull(task_ids="check_gpu_usage")["gpu_usage"]["source"] == "cloud-monitoring"
    # Nothing of the run is left: no active job, no staging folder, nothing under the run's prefix.
    assert [name for name in gcs.list(BUCKET) if "_gpuflow-staging-" in name or name.startswith(f"gpuflow/{prefix}/")
            ] == []
    assert all(job.stopped_state or job.script[job.step][0].name in ("JOB_STATE_DONE",)
               for job in cloud.dataflow.jobs.values() if "llm-batch-us-east4" in job.name)
