"""A persistent deployment on the local profile, end to end with the real Airflow (dag.test()), the emulators and
a detached DirectRunner process: deploy v1, roll v2 (the same weights, re-exported) out while prompts flow, refuse
a v3 of noisy weights made slower too at the rollout gate (rollout.eval_set: both versions' answers to gpuflow's
demo evaluation set, on the batch runner), replace the job for a changed option, tear it all down. Every published
prompt is answered.

On the way, gpuflow_janitor meets a run killed mid-launch (its pipeline process, topics, subscriptions and bucket
left, its DAG run deleted): it lists exactly those in a dry run, then deletes exactly those, and leaves the live
deployment alone. (One test, so that the deployment is made once.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from airflow.utils.state import DagRunState

from gpuflow.paths import project_path
from gpuflow.runs.naming import deployment_prefix, resource_names, run_prefix

DEPLOYMENT = "gf-test-deploy"
BUCKET = "gpuflow-deploy-test"
#: The rollout gate's evaluation set, in the bucket: gpuflow's demo set (no references: agreement with the serving
#: version). The latency bound is the default, although the serving job and another test share two cores with the
#: evaluation: both versions run in one process, their batches interleaved, and the gate takes the median ratio of
#: the paired batches.
EVAL_SET = f"gs://{BUCKET}/eval/demo.jsonl"
MAX_LATENCY_RATIO = 1.5


class SiteRuns:
    """A run of one of gpuflow's DAGs of the site whose file the conf names (``tests.helpers.run_dag``)."""

    def __init__(self, dag_name: str):
        self.dag_name = dag_name

    def test(self, run_conf: dict):
        from tests.helpers import run_dag

        return run_dag(self.dag_name, run_conf)


@pytest.fixture
def dags(airflow_db):
    return SiteRuns("llm_streaming_inference"), SiteRuns("llm_streaming_teardown"), SiteRuns("gpuflow_janitor")


def conf(local_config, model_dir: Path, latency_ratio: float = MAX_LATENCY_RATIO, **extra) -> dict:
    """A deployment's run: its bucket and model in the site's configuration file, the knobs in the conf."""
    from tests.helpers import local_site_file, site_config

    return {
        # The site allows lasting deployments (limits.lasting_deployments) and sets how often the job looks for a
        # new version: no form shows that.
        "config_file": site_config("deployment.yaml", local_site_file(), bucket=BUCKET,
                                   **{"model.name": str(model_dir), "limits.lasting_deployments": True,
                                      "deployment.refresh_interval_s": 1, "rollout.eval_set": EVAL_SET,
                                      "rollout.max_latency_ratio": latency_ratio}),
        "deployment__mode": "persistent", "deployment__name": DEPLOYMENT,
        # A replacement job loads its model while the old one serves and another test may run beside: on two
        # cores its first answer came after 60 s. The smoke test ends as soon as every answer is in.
        "deployment__rollout_timeout_s": 240,
        "model__max_new_tokens": 6, "inference__max_batch_size": 16,
        **extra,
    }


class Traffic:
    """Publishes a prompt every ``INTERVAL_S`` to the deployment's prompts topic, and collects every answer and dead
    letter (on subscriptions of its own) with the model version each answer names."""

    #: A prompt a second keeps the topic in use through every switch. (Five a second, under CI's load, left the
    #: replacing job 42 to 67 s of backlog to answer before the smoke test's prompts.)
    INTERVAL_S = 1.0

    def __init__(self, local_config):
        from google.cloud import pubsub_v1

        self.config, self.project = local_config, local_config.project
        self.publisher, self.subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
        prefix = deployment_prefix(DEPLOYMENT)
        self.topic = self.publisher.topic_path(self.project, f"{prefix}-prompts")
        self.subscriptions = {}
        for kind, topic in (("answers", "responses"), ("dead", "dead-letters")):
            path = self.subscriber.subscription_path(self.project, f"test-traffic-{kind}")
            self.subscriber.create_subscription(name=path, topic=self.publisher.topic_path(self.project,
                                                                                        f"{prefix}-{topic}"))
            self.subscriptions[kind] = path
        self.sent: dict[str, float] = {}
        self.answers: list[tuple[str, str, float]] = []  # (id, model version, received at)
        self.dead: list[dict] = []
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._publish, daemon=True),
                         threading.Thread(target=self._collect, daemon=True)]
        for thread in self._threads:
            thread.start()

    def _publish(self):
        number = 0
        while not self._stop.is_set():
            prompt_id = f"load-{number}"
            self.publisher.publish(self.topic, b"what is the capital of france", id=prompt_id).result()
            self.sent[prompt_id] = time.time()
            number += 1
            self._stop.wait(self.INTERVAL_S)

    def _pull(self, kind: str):
        response = self.subscriber.pull(subscription=self.subscriptions[kind], max_messages=100, timeout=5)
        if response.received_messages:
            self.subscriber.acknowledge(subscription=self.subscriptions[kind],
                                        ack_ids=[m.ack_id for m in response.received_messages])
        return [m.message for m in response.received_messages]

    def _collect(self):
        while not self._stop.is_set() or not self.all_answered():
            for message in self._pull("answers"):
                self.answers.append((message.attributes["id"], message.attributes["model"], time.time()))
            for message in self._pull("dead"):
                self.dead.append(json.loads(message.data))
            if self._stop.is_set() and time.time() > self._stopped_at + 120:
                break

    def all_answered(self) -> bool:
        answered = {prompt_id for prompt_id, _, _ in self.answers}
        return all(prompt_id in answered for prompt_id in self.sent)

    def stop(self):
        self._stopped_at = time.time()
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=180)
        for path in self.subscriptions.values():
            self.subscriber.delete_subscription(subscription=path)

    def wait_for_prompts_after(self, moment: float, count: int, timeout_s: float = 60) -> None:
        """Until ``count`` prompts were published after ``moment``."""
        deadline = time.monotonic() + timeout_s
        while sum(sent > moment for sent in list(self.sent.values())) < count:
            assert time.monotonic() < deadline, f"fewer than {count} prompts were published after {moment}"
            time.sleep(0.1)

    def versions_after(self, moment: float) -> set[str]:
        """The versions that answered the prompts published after ``moment``."""
        return {version for prompt_id, version, _ in self.answers if self.sent.get(prompt_id, 0) > moment}


def local_conf(local_config, **extra) -> dict:
    from tests.helpers import local_site_file

    return {"config_file": local_site_file(), "model__max_new_tokens": 4, **extra}


def kill_a_run_mid_launch(local_config, state_dir: Path) -> str:
    """Run llm_streaming_inference in a process of its own, and SIGKILL it once its pipeline process has started
    (the launch task waits for it to run): what a worker that died mid-launch leaves. Returns the run's prefix."""
    before = set(state_dir.glob("*-pipeline.pid"))
    script = textwrap.dedent("""
        import json, sys
        from gpuflow.site_dags import site_dag

        site_dag(sys.argv[2], "llm_streaming_inference").test(run_conf=json.loads(sys.argv[1]))
    """)
    import json

    from tests.helpers import local_site_file, site_dag

    site_dag(local_site_file(), "llm_streaming_inference")  # its DAG file, which dag.test() parses
    conf = local_conf(local_config)
    config_file = conf.pop("config_file")

    log = open(state_dir / "killed-run.log", "wb")  # noqa: SIM115 - the run's output, for a failure's reader
    worker = subprocess.Popen([sys.executable, "-c", script, json.dumps(conf), config_file],
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while not (started := set(state_dir.glob("*-pipeline.pid")) - before):
        assert worker.poll() is None and time.monotonic() < deadline, "the run ended before its launch"
        time.sleep(0.2)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    (pid_file,) = started
    return pid_file.name.removesuffix("-pipeline.pid")


def delete_dag_run(run_id: str) -> None:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    with create_session() as session:
        session.execute(delete(DagRun).where(DagRun.run_id == run_id))


def new_weights(model_dir: Path, seed: int) -> None:
    """The same model (config, tokenizer) with other weights: what a retraining exports."""
    import torch
    from transformers import T5ForConditionalGeneration

    model = T5ForConditionalGeneration.from_pretrained(model_dir)
    torch.manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.5)
    model.save_pretrained(model_dir)


#: A deployment whose names start with the tested one's prefix (gfd-gf-test-deploy-eu-… after gfd-gf-test-deploy-):
#: tearing the tested one down must leave every resource of it.
SIBLING = DEPLOYMENT + "-eu"


def a_sibling_deployment(local_config, model_dir: Path):
    """The sibling's own topics and job subscription (labelled as its own) with a backlog of 3 prompts, and a job
    process labelled as its own whose pid file's name starts with the tested deployment's prefix."""
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    from gpuflow.configuration.loading import load_config
    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment
    from gpuflow.platform.processes import LABELS_VARIABLE, spawn_logged
    from gpuflow.steps.resources import create_resources

    config = load_config(conf(local_config, model_dir)["config_file"],
                         overrides=["deployment.mode=persistent", f"deployment.name={SIBLING}"])
    names = resource_names(config, "gf-00000000ee")
    with emulator_environment(config):
        create_resources(config, names, LOCAL_CONN_ID)
        PubSubHook(gcp_conn_id=LOCAL_CONN_ID).publish(
            project_id=config.project, topic=names.prompts_topic,
            messages=[{"data": f"backlog {i}".encode()} for i in range(3)])
    state_dir = Path(config.local.state_dir)
    stem = f"{deployment_prefix(SIBLING)}-00000000ee-pipeline"
    pid = spawn_logged([sys.executable, "-c", "import time; time.sleep(900)", "llm_inference.py"],
                       state_dir / f"{stem}.log", {**os.environ, LABELS_VARIABLE: json.dumps(names.labels)})
    (state_dir / f"{stem}.pid").write_text(str(pid))
    return names, pid


def the_sibling_is_untouched(local_config, sibling, pid: int) -> None:
    """Its topics and subscription are there, with its backlog still to pull, and its job runs; then it goes."""
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    from gpuflow.platform.emulators import LOCAL_CONN_ID, process_alive, stop_process_group
    from gpuflow.steps.resources import delete_resources, list_named

    left = list_named(local_config, LOCAL_CONN_ID, deployment_prefix(SIBLING) + "-")
    assert sorted(left["topics"]) == sorted(sibling.topics)
    assert left["subscriptions"] == [sibling.prompts_subscription]
    assert process_alive(pid)
    pulled = PubSubHook(gcp_conn_id=LOCAL_CONN_ID).pull(
        project_id=local_config.project, subscription=sibling.prompts_subscription, max_messages=10)
    assert sorted(message.message.data for message in pulled) == [f"backlog {i}".encode() for i in range(3)]
    stop_process_group(pid)
    delete_resources(local_config, sibling.model_copy(update={"deployment": None}), LOCAL_CONN_ID)


def record(local_config) -> dict | None:
    path = Path(local_config.local.state_dir) / "deployments" / f"{DEPLOYMENT}.json"
    return json.loads(path.read_text()) if path.exists() else None


def version_of(run) -> str:
    from gpuflow.configuration.loading import load_config
    from gpuflow.paths import site_dir

    site = run.dag_id.split("__")[0]  # the site's file lies in the site folder (tests.helpers.site_config)
    config = load_config(site_dir() / f"{site}.yaml", run.conf)
    return resource_names(config, run_prefix(run.dag_id, run.run_id)).model_version


def states(run) -> dict:
    return {ti.task_id: ti.state for ti in run.get_task_instances()}


DEMO_SET = project_path("configs/eval_sets/demo.jsonl")  # (under data/ in Composer's layout)
DEMO_SET_SIZE = sum(1 for line in DEMO_SET.read_text().splitlines() if line.strip())


def upload_the_demo_eval_set(local_config) -> None:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from gpuflow.gcs_uris import split_gcs_uri
    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment

    with emulator_environment(local_config):
        hook = GCSHook(gcp_conn_id=LOCAL_CONN_ID)
        if not hook.get_conn().bucket(BUCKET).exists():
            hook.create_bucket(bucket_name=BUCKET, project_id=local_config.project)
        hook.upload(*split_gcs_uri(EVAL_SET), filename=str(DEMO_SET))


def gate_of(run) -> dict:
    """The rollout gate's decision: its XCom (pushed whether it passed or refused)."""
    ti = run.get_task_instance("evaluate")
    return ti.xcom_pull(task_ids="evaluate", key="rollout_gate") or ti.xcom_pull(task_ids="evaluate")


def refused_at_the_gate(run, bounds: tuple[str, ...], local_config, serving: str) -> None:
    """The gate refused the run's version, naming each of ``bounds`` with both figures: nothing launched, the record
    and the serving version's pointer are as they were, and cleanup ran."""
    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment
    from gpuflow.platform.records import Records

    assert run.state == DagRunState.FAILED
    assert states(run)["evaluate"] == "failed" and states(run)["launch"] == "upstream_failed", states(run)
    assert states(run)["cleanup"] == "success", states(run)
    decision = gate_of(run)
    assert decision["decision"] == "refuse", decision
    for bound in bounds:
        assert bound in decision["why"], decision
        named = decision["why"][decision["why"].index(bound):]
        if bound == "latency: ":  # the median of the paired batches' ratios, and each version's median batch
            assert str(decision["median_latency_ratio"]) in named, named
        figures = "mean_score" if bound == "score: " else "p50_latency_s"
        for version in ("serving", "candidate"):
            assert str(decision[version][figures]) in named, (version, named)
    assert record(local_config)["model_version"] == serving
    with emulator_environment(local_config):
        page = Records(local_config, LOCAL_CONN_ID).gcs.download(
            BUCKET, f"gpuflow/deployments/{DEPLOYMENT}/evaluations/{run_prefix(run.dag_id, run.run_id)}.md")
    assert b"refuse" in page and decision["candidate"]["version"].encode() in page


def the_runs_own_objects_are_gone(local_config, run) -> None:
    """The evaluation's answers lay under the run's folder: its cleanup deleted them with the rest."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment

    with emulator_environment(local_config):
        left = GCSHook(gcp_conn_id=LOCAL_CONN_ID).list(
            BUCKET, prefix=f"gpuflow/{run_prefix(run.dag_id, run.run_id)}/")
    assert left == []


def the_janitor_removes_a_killed_runs_leftovers_and_keeps(janitor, local_config, live: dict) -> None:
    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment, process_alive
    from gpuflow.platform.records import Records
    from gpuflow.runs.naming import resource_names, run_prefix
    from gpuflow.steps.resources import list_named, list_run_resources

    state_dir = Path(local_config.local.state_dir)

    killed = resource_names(local_config, kill_a_run_mid_launch(local_config, state_dir))
    pid = int((state_dir / f"{killed.prefix}-pipeline.pid").read_text())
    with emulator_environment(local_config):
        lease = Records(local_config, LOCAL_CONN_ID).read_lease(killed.prefix)
        left = list_run_resources(local_config, killed, LOCAL_CONN_ID)
        live_before = list_named(local_config, LOCAL_CONN_ID, deployment_prefix(DEPLOYMENT))
    assert len(left["topics"]) == 3 and len(left["subscriptions"]) == 3 and left["buckets"] == [killed.bucket]
    assert process_alive(pid)
    assert lease["dag_id"] == "local__llm_streaming_inference"
    assert run_prefix(lease["dag_id"], lease["run_id"]) == killed.prefix
    delete_dag_run(lease["run_id"])

    from tests.helpers import local_site_file

    # The killed run's site's janitor: the deployment is another site's (deployment.yaml's), and left alone.
    janitor_conf = {"config_file": local_site_file()}
    dry = janitor.test(run_conf={**janitor_conf, "janitor__dry_run": True})
    assert dry.state == DagRunState.SUCCESS
    listed = dry.get_task_instance("janitor").xcom_pull(task_ids="janitor")
    assert listed["dry_run"] is True
    assert [job["id"] for job in listed["jobs"]] == [str(pid)]
    assert sorted(listed["topics"]) == sorted(left["topics"])
    assert sorted(listed["subscriptions"]) == sorted(left["subscriptions"])
    assert listed["buckets"] == [killed.bucket] and listed["prefixes"] == []
    alone = {item["name"]: item["why"] for item in listed["left_alone"]}
    assert live_before["topics"] and all(alone.get(topic, "").startswith("made by site deployment's DAGs")
                                         for topic in live_before["topics"])
    assert process_alive(pid)  # a dry run deletes nothing

    swept = janitor.test(run_conf={**janitor_conf, "janitor__dry_run": False})
    assert swept.state == DagRunState.SUCCESS
    assert not process_alive(pid)
    with emulator_environment(local_config):
        assert list_run_resources(local_config, killed, LOCAL_CONN_ID) == {"topics": [], "subscriptions": [],
                                                                          "buckets": []}
        assert list_named(local_config, LOCAL_CONN_ID, deployment_prefix(DEPLOYMENT)) == live_before
        assert Records(local_config, LOCAL_CONN_ID).read(DEPLOYMENT).model_dump(mode="json") == live
    assert process_alive(int(live["job"]["id"]))


@pytest.mark.slow
def test_a_persistent_deployment_rolls_out_replaces_rolls_back_and_tears_down(dags, local_config, emulators,
                                                                             tmp_path):
    from gpuflow.platform.demo_model import write_demo_model
    from gpuflow.platform.emulators import LOCAL_CONN_ID, emulator_environment
    from gpuflow.steps.resources import list_named

    serve, teardown, janitor = dags
    model_dir = tmp_path / "model"
    write_demo_model(model_dir, seed=0)
    upload_the_demo_eval_set(local_config)

    # 1. Deploy v1: a new deployment. The demo set has no references, so there is nothing to gate it against.
    first = serve.test(run_conf=conf(local_config, model_dir))
    assert first.state == DagRunState.SUCCESS, states(first)
    v1 = version_of(first)
    assert first.get_task_instance("preflight").xcom_pull(task_ids="preflight", key="gpuflow_rollout")["path"] == "new"
    assert gate_of(first)["decision"] == "skipped" and "no references" in gate_of(first)["why"]
    deployed = record(local_config)
    assert deployed["model_version"] == v1 and deployed["changed_by"] == first.run_id

    with emulator_environment(local_config):
        traffic = Traffic(local_config)
        try:
            # 2. The same weights, exported again while prompts flow: the gate finds both versions' answers the
            # same, and the running job switches, no new job.
            second = serve.test(run_conf=conf(local_config, model_dir))
            assert second.state == DagRunState.SUCCESS, states(second)
            v2 = version_of(second)
            plan = second.get_task_instance("preflight").xcom_pull(task_ids="preflight", key="gpuflow_rollout")
            assert plan["path"] == "weights", plan
            assert record(local_config)["job"] == deployed["job"]  # the same process serves on
            assert record(local_config)["model_version"] == v2
            gated = record(local_config)["evaluation"]
            assert gated == gate_of(second) and gated["decision"] == "promote"
            assert (gated["serving"]["version"], gated["candidate"]["version"]) == (v1, v2)
            assert gated["serving"]["mean_score"] == gated["candidate"]["mean_score"] == 1.0
            assert gated["serving"]["prompts"] == gated["candidate"]["prompts"] == DEMO_SET_SIZE
            for figures in (gated["serving"], gated["candidate"]):
                assert 0 < figures["p50_latency_s"] <= figures["p95_latency_s"] and figures["tokens_per_s"] > 0
            the_runs_own_objects_are_gone(local_config, second)
            switched_at = time.time()

            # 3. Weights with noise added, generating 32 times the tokens per answer: they answer otherwise and
            # slower, so the gate refuses them on both bounds before anything switches. (Both versions in one
            # process, their batches interleaved, 9 rounds of the set: the median ratio of 8 paired batches.)
            new_weights(model_dir, seed=1)
            refused = serve.test(run_conf=conf(local_config, model_dir, latency_ratio=2.0, model__max_new_tokens=192))
            refused_at_the_gate(refused, ("score: ", "latency: "), local_config, v2)
            refusal = gate_of(refused)
            assert refusal["candidate"]["mean_score"] < 1.0 - 0.05 and refusal["serving"]["mean_score"] == 1.0
            assert refusal["candidate"]["p95_latency_s"] > refusal["serving"]["p95_latency_s"] * 2.0
            assert refusal["median_latency_ratio"] > 2.0 and len(refusal["pairs"]) >= 8
            the_runs_own_objects_are_gone(local_config, refused)
            write_demo_model(model_dir, seed=0)  # v1's weights again

            # 4. A changed pipeline option: the local DirectRunner cannot update in place, so the job is replaced
            # (the gate evaluates both with the candidate's batching, and they agree).
            third = serve.test(run_conf=conf(local_config, model_dir, inference__max_batch_size=8))
            assert third.state == DagRunState.SUCCESS, states(third)
            plan = third.get_task_instance("preflight").xcom_pull(task_ids="preflight", key="gpuflow_rollout")
            assert plan["path"] == "replace" and "inference.max_batch_size" in plan["changed"], plan
            assert gate_of(third)["decision"] == "promote", gate_of(third)
            v3, replaced = version_of(third), record(local_config)
            assert replaced["job"]["id"] != deployed["job"]["id"] and replaced["model_version"] == v3
            replaced_at = time.time()
            traffic.wait_for_prompts_after(replaced_at, 3)
        finally:
            traffic.stop()

    # Every prompt published through all of it was answered; none was dead-lettered.
    assert traffic.sent and traffic.all_answered(), sorted(set(traffic.sent) - {a[0] for a in traffic.answers})
    assert traffic.dead == []
    served = {version for _, version, _ in traffic.answers}
    assert {v1, v2, v3} <= served and version_of(refused) not in served
    assert traffic.versions_after(switched_at) <= {v2, v3}
    assert traffic.versions_after(replaced_at) == {v3}

    # The janitor, beside the live deployment: a run killed mid-launch, whose DAG run is then deleted.
    the_janitor_removes_a_killed_runs_leftovers_and_keeps(janitor, local_config, record(local_config))

    # 5. The teardown stops the job and deletes the deployment's topics, subscriptions, model and record, and
    # nothing of a deployment beside it whose names start with its own.
    sibling, sibling_pid = a_sibling_deployment(local_config, model_dir)
    # A deployment belongs to the configuration file it was made from: another team's file (the same bucket and
    # deployment name) can neither roll out onto it nor tear it down.
    from tests.helpers import site_config

    served = record(local_config)
    assert served["config_file"] == str(Path(conf(local_config, model_dir)["config_file"]).resolve())
    other_team = site_config("other-team.yaml", conf(local_config, model_dir)["config_file"])
    refused = serve.test(run_conf={**conf(local_config, model_dir), "config_file": other_team})
    assert (refused.state, states(refused)["preflight"]) == (DagRunState.FAILED, "failed"), states(refused)
    refused = teardown.test(run_conf={"config_file": other_team, "deployment__name": DEPLOYMENT})
    assert refused.state == DagRunState.FAILED, states(refused)
    assert record(local_config) == served
    from gpuflow.platform import JobHandle, get_platform

    assert get_platform(local_config).job_running(JobHandle.model_validate(served["job"]))  # still serving
    down = teardown.test(run_conf={"config_file": conf(local_config, model_dir)["config_file"],
                                   "deployment__name": DEPLOYMENT})
    assert down.state == DagRunState.SUCCESS, states(down)
    assert record(local_config) is None
    with emulator_environment(local_config):
        found = list_named(local_config, LOCAL_CONN_ID, deployment_prefix(DEPLOYMENT))
        assert {kind: [name for name in names if not name.startswith(deployment_prefix(SIBLING) + "-")]
                for kind, names in found.items()} == {"topics": [], "subscriptions": []}
        the_sibling_is_untouched(local_config, sibling, sibling_pid)
        from airflow.providers.google.cloud.hooks.gcs import GCSHook

        assert GCSHook(gcp_conn_id=LOCAL_CONN_ID).list(BUCKET, prefix="gpuflow/") == []
    from gpuflow.platform.emulators import process_alive

    for job in (deployed["job"], replaced["job"]):
        assert not process_alive(int(job["id"]))
