"""Shared fixtures. Airflow settings go into the environment before anything imports airflow.

Never import this module from a test (it would run again under another name and move AIRFLOW_HOME);
shared helpers live in tests/helpers.py.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.helpers import ROOT  # noqa: E402 - helpers has no side effects

_AIRFLOW_HOME = Path(tempfile.mkdtemp(prefix="gpuflow-test-airflow-"))
os.environ.update(
    {
        "AIRFLOW_HOME": str(_AIRFLOW_HOME),
        "AIRFLOW__CORE__DAGS_FOLDER": str(ROOT / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(ROOT / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        # gpuflow's waiting tasks defer, as on a Composer environment that sets it (docs/composer.md); the
        # deferrable=False tests set False where they build their DAGs.
        "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "True",
        # dag.test() runs triggers in line, with no scheduler to race (gpuflow.triggers.settle); the live Airflow
        # test drops it again, so its triggerer holds events as in production.
        "GPUFLOW_TRIGGER_SETTLE_S": "0",
    }
)
# Two test workers share two cores (make test: -n 2). torch's default is a compute thread per core in every process
# (the tests, their pipelines, Airflow's tasks), and those threads spin-wait on each other's cores: measured here, a
# pipeline test took 92 s beside another instead of 30 s, and a batch test 59 s instead of 9. One thread each, as
# the rollout gate's evaluation runs (beam_jobs/evaluate_interleaved.py); the processes inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# beam_jobs/ beside plugins/ in a checkout, under data/ in Composer's layout (make test-composer)
BEAM_JOBS = ROOT / "beam_jobs" if (ROOT / "beam_jobs").is_dir() else ROOT / "data" / "beam_jobs"
sys.path.insert(0, str(BEAM_JOBS))

# The test configuration: the local profile with its own state directory.
TEST_STATE_DIR = Path(tempfile.mkdtemp(prefix="gpuflow-test-state-"))
# The deployment's site folder of configuration files, this process's own: where each test writes what a run's conf
# may not set (tests.helpers.site_config), as a deployment manager writes a team's site file.
os.environ["GPUFLOW_SITE_DIR"] = str(TEST_STATE_DIR / "site")
# The DAG files of the sites a test runs (tests.helpers.site_dag), this process's own: a DAG bundle beside the
# repository's dags/, since dag.test() finds a DAG by parsing its bundle. One file per DAG, removed after each test
# (``_site_dag_files``), so that a dag.test() never parses another test's.
TEST_SITE_DAGS = TEST_STATE_DIR / "site-dags"
TEST_SITE_DAGS.mkdir()
os.environ["GPUFLOW_TEST_SITE_DAGS"] = str(TEST_SITE_DAGS)
os.environ["AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST"] = json.dumps([
    {"name": "dags-folder", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle", "kwargs": {}},
    {"name": "gpuflow-test-sites", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
     "kwargs": {"path": str(TEST_SITE_DAGS)}}])


@pytest.fixture(autouse=True)
def _site_dag_files():
    """The site DAG files a test wrote go when it ends."""
    yield
    for path in TEST_SITE_DAGS.glob("*.py"):
        path.unlink()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="session")
def local_config():
    """The local profile on emulator ports of this session's own, so no other run's emulators are shared."""
    from gpuflow.configuration.loading import load_config
    from tests.helpers import local_site_file, site_config

    site_config("local.yaml", **{
        "local.state_dir": str(TEST_STATE_DIR), "smoke_test.timeout_s": 240,
        "local.pubsub_emulator_host": f"localhost:{_free_port()}",
        "local.storage_emulator_host": f"http://localhost:{_free_port()}"})
    return load_config(local_site_file())


@pytest.fixture(scope="session")
def emulators(local_config):
    """The real Pub/Sub emulator and GCS emulator, started once for the session."""
    from gpuflow.platform.emulators import running_emulators

    with running_emulators(local_config, TEST_STATE_DIR / "emulators") as env:
        yield env


def pytest_configure(config):
    """The session's PostgreSQL is recorded in a state file that this process (xdist's controller, or the only
    process) names and its workers inherit; the session's end stops the server (``pytest_unconfigure``)."""
    if not hasattr(config, "workerinput"):
        os.environ["GPUFLOW_TEST_POSTGRES_STATE"] = str(
            Path(tempfile.mkdtemp(prefix="gpuflow-test-postgres-state-")) / "server.json")


def pytest_sessionfinish(session, exitstatus):
    """Under xdist a worker's ``pytest.exit`` reaches the controller as a crash, without its message: the controller
    says why the server did not start, with the fix (the worker recorded it beside the state file)."""
    state = os.environ.get("GPUFLOW_TEST_POSTGRES_STATE")
    if hasattr(session.config, "workerinput") or not state or not session.config.pluginmanager.getplugin("dsession"):
        return
    failure = Path(state).with_suffix(".failed")
    if failure.exists():
        reporter = session.config.pluginmanager.getplugin("terminalreporter")
        reporter.write_line(f"the test session's PostgreSQL did not start: {failure.read_text()}", red=True, bold=True)
        session.exitstatus = pytest.ExitCode.INTERRUPTED


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and (state := os.environ.get("GPUFLOW_TEST_POSTGRES_STATE")):
        import shutil

        from tests.postgres import stop_shared_server

        stop_shared_server(Path(state))
        shutil.rmtree(Path(state).parent, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server():
    """The session's PostgreSQL server (tests/postgres.py), for the tests that start Airflow's services. It never
    falls back to SQLite: where it cannot start, the session stops at once with the fix."""
    from tests.postgres import PostgresUnavailable, shared_server

    try:
        return shared_server(Path(os.environ["GPUFLOW_TEST_POSTGRES_STATE"]), _free_port())
    except PostgresUnavailable as problem:
        pytest.exit(f"the test session's PostgreSQL did not start: {problem}", returncode=3)


def _built_once(tmp_path_factory, name: str, build) -> Path:
    """``build(folder)``, run once per test session into a folder its xdist workers share (pytest-xdist's
    documented ``getbasetemp().parent``): the first worker that needs it builds it while holding a lock, and the
    other waits and reads it. (Each worker built its own: 5 to 7 s each, twice.) The folder is read-only by
    convention: a test that changes a model copies it first."""
    import fcntl

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    target = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            partial = shared / f"{name}.partial-{os.getpid()}"
            partial.mkdir()
            build(partial)
            partial.rename(target)  # whole, or not there
    return target


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory) -> Path:
    """An Airflow SQLite database that `airflow db migrate` made once for the session: a new Airflow home copies it
    (``shutil.copyfile``) where it would migrate its own. Never written."""
    def migrate(folder: Path) -> None:
        subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True,
                       env={**os.environ, "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{folder}/airflow.db"})

    return _built_once(tmp_path_factory, "airflow-db", migrate) / "airflow.db"


@pytest.fixture(scope="session")
def airflow_db(migrated_sqlite):
    """This process's Airflow home, its SQLite database migrated."""
    import shutil

    shutil.copyfile(migrated_sqlite, _AIRFLOW_HOME / "airflow.db")
    return _AIRFLOW_HOME


def _demo_model(tmp_path_factory, architecture: str) -> Path:
    from gpuflow.platform.demo_model import write_demo_model

    return _built_once(tmp_path_factory, f"demo-{architecture}",
                       lambda folder: write_demo_model(folder, architecture=architecture))


def _export(model_dir: Path, tmp_path_factory) -> Path:
    """The model exported with download_model.py local (bf16 state_dict, config, tokenizer)."""
    def export(folder: Path) -> None:
        subprocess.run(
            [sys.executable, str(BEAM_JOBS / "download_model.py"), "local", "--model-name", str(model_dir),
             "--state-dict-path", str(folder / "state_dict.pth")],
            check=True, capture_output=True,
        )

    return _built_once(tmp_path_factory, f"export-{model_dir.name}", export) / "state_dict.pth"


def _reference_generate(exported: Path):
    """model.generate on one prompt at a time, greedy, with the exported weights: the ground truth. For a causal
    model the answer is what follows the prompt."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    model_dir = exported.parent
    config = AutoConfig.from_pretrained(model_dir)
    auto_class = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto_class.from_config(config)
    model.load_state_dict(torch.load(exported, weights_only=True))  # bf16 values copied into fp32
    model.eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    def generate(prompt: str, max_new_tokens: int) -> str:
        encoded = tokenizer(prompt, return_tensors="pt")
        with torch.inference_mode():
            output = model.generate(**encoded, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                    pad_token_id=tokenizer.pad_token_id)
        new = output[0] if config.is_encoder_decoder else output[0, encoded["input_ids"].shape[1]:]
        return tokenizer.decode(new, skip_special_tokens=True)

    generate.tokenizer = tokenizer
    return generate


@pytest.fixture(scope="session")
def demo_model_dir(tmp_path_factory) -> Path:
    return _demo_model(tmp_path_factory, "seq2seq")


@pytest.fixture(scope="session")
def exported_model(demo_model_dir, tmp_path_factory) -> Path:
    return _export(demo_model_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def reference_generate(exported_model):
    return _reference_generate(exported_model)


@pytest.fixture(scope="session")
def demo_causal_model_dir(tmp_path_factory) -> Path:
    return _demo_model(tmp_path_factory, "causal")


@pytest.fixture(scope="session")
def exported_causal_model(demo_causal_model_dir, tmp_path_factory) -> Path:
    return _export(demo_causal_model_dir, tmp_path_factory)


@pytest.fixture(scope="session")
def reference_generate_causal(exported_causal_model):
    return _reference_generate(exported_causal_model)


def pytest_collection_modifyitems(config, items):
    """Everything under tests/integration is marked integration, so `-m "not integration"` is the fast set; a test
    on the real Airflow services (the ``airflow_live`` fixture) is also marked live."""
    for item in items:
        if "integration" in Path(str(item.fspath)).parts:
            item.add_marker(pytest.mark.integration)
        if "airflow_live" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.live)


@functools.cache
def _remote(host: str) -> bool:
    """A host off this machine: neither a loopback name or address, nor this machine's own name. Cached: every
    lookup in a test asks, and this machine's full name (getfqdn) is itself a lookup."""
    import ipaddress
    import socket

    host = host.strip("[]")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host not in {"localhost", socket.gethostname(), socket.getfqdn()}
    return not (address.is_loopback or address.is_unspecified)


@pytest.fixture(autouse=True)
def nothing_reaches_google(monkeypatch):
    """Every Google service a test talks to is an emulator or a fake: a test that reaches for a remote host (a gRPC
    channel to *.googleapis.com, or a name lookup for the REST clients) fails, naming it, instead of waiting out the
    client's retries on this offline machine. Subprocesses (emulators, Airflow services) are not watched."""
    import socket

    from google.api_core import grpc_helpers, grpc_helpers_async

    reached: list[str] = []

    def refuse(host: str) -> None:
        reached.append(host)
        raise socket.gaierror(socket.EAI_NONAME, f"a test reached for {host}; fake it (tests/gcp_fakes)")

    real_lookup = socket.getaddrinfo

    def lookup(host, *args, **kwargs):
        name = host.decode() if isinstance(host, bytes) else host
        if name and _remote(name):
            refuse(name)
        return real_lookup(host, *args, **kwargs)

    def guarded_channel(real):
        def create_channel(target, *args, **kwargs):
            host = str(target).removeprefix("dns:///").rsplit(":", 1)[0]
            if _remote(host):
                refuse(host)
            return real(target, *args, **kwargs)

        return create_channel

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(grpc_helpers, "create_channel", guarded_channel(grpc_helpers.create_channel))
    monkeypatch.setattr(grpc_helpers_async, "create_channel", guarded_channel(grpc_helpers_async.create_channel))
    yield
    assert not reached, f"the test reached for {sorted(set(reached))}: fake the service (tests/gcp_fakes)"


@pytest.fixture
def gcp_env(emulators, monkeypatch):
    """The gcp profile's hooks on the emulators: an anonymous google_cloud_default, no metadata-server probes."""
    from tests.gcp_fakes import gcp_test_environment
    from tests.helpers import GCP_TEST_PROJECT

    env = gcp_test_environment(emulators, GCP_TEST_PROJECT, "google_cloud_default")
    for key in ("NO_GCE_CHECK", "GOOGLE_CLOUD_PROJECT", "PUBSUB_PROJECT_ID", "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT",
                "PYTHONPATH"):
        monkeypatch.setenv(key, env[key])
    return env


@pytest.fixture
def gcp_connection(monkeypatch):
    """An anonymous google_cloud_default, for provider hooks that ask for credentials (fakes under them)."""
    import json

    from tests.helpers import GCP_TEST_PROJECT

    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps(
        {"conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "project": GCP_TEST_PROJECT}}))


@pytest.fixture
def gcs_bucket(gcp_env):
    """A bucket on the GCS emulator (created once), reached through the provider's GCSHook: gcs_bucket(name)."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    from tests.helpers import GCP_TEST_PROJECT

    hook = GCSHook(gcp_conn_id="google_cloud_default")

    def ensure(name: str):
        if not hook.get_conn().bucket(name).exists():
            hook.create_bucket(bucket_name=name, project_id=GCP_TEST_PROJECT)
        return hook

    return ensure


@pytest.fixture
def create_calls(monkeypatch):
    """Every create call gpuflow makes through the provider's hooks (topics, subscriptions, buckets) and every
    process it starts, each recorded with what it was given and passed on: ``create_calls`` -> [(kind, name,
    labels)]. ``assert_all_labelled(calls, names)`` checks that each carries the run's labels."""
    import json as json_module

    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    import gpuflow.platform.local_jobs as local_jobs
    from gpuflow.platform.processes import LABELS_VARIABLE

    calls: list[tuple[str, str, dict]] = []

    def recording(kind, original, name_of, labels_of):
        def record(*args, **kwargs):
            calls.append((kind, name_of(args, kwargs), dict(labels_of(args, kwargs) or {})))
            return original(*args, **kwargs)
        return record

    monkeypatch.setattr(PubSubHook, "create_topic", recording(
        "topic", PubSubHook.create_topic, lambda a, k: k["topic"], lambda a, k: k.get("labels")))
    monkeypatch.setattr(PubSubHook, "create_subscription", recording(
        "subscription", PubSubHook.create_subscription, lambda a, k: k["subscription"], lambda a, k: k.get("labels")))
    monkeypatch.setattr(GCSHook, "create_bucket", recording(
        "bucket", GCSHook.create_bucket, lambda a, k: k["bucket_name"], lambda a, k: k.get("labels")))
    monkeypatch.setattr(local_jobs, "spawn_logged", recording(
        "process", local_jobs.spawn_logged, lambda a, k: str(a[1]),
        lambda a, k: json_module.loads(a[2].get(LABELS_VARIABLE, "{}"))))
    return calls
