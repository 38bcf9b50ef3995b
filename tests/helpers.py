"""Helpers shared by tests. No side effects on import (unlike conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def mixed_length_prompts(tokenizer, count: int, max_tokens: int = 300, seed: int = 7) -> list[str]:
    """Prompts whose token counts (with EOS) spread from 1 to ``max_tokens``."""
    import random

    from gpuflow.platform.demo_model import _WORDS

    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        target = 1 + (i * (max_tokens - 1)) // max(count - 1, 1)
        words: list[str] = []
        while True:
            candidate = " ".join([*words, rng.choice(_WORDS)])
            if len(tokenizer(candidate)["input_ids"]) > target:
                break
            words = candidate.split()
        prompts.append(" ".join(words) if words else rng.choice(_WORDS))
    rng.shuffle(prompts)
    return prompts


#: The project id the gcp-profile tests use on the emulators.
GCP_TEST_PROJECT = "gpuflow-gcp-test"


def first_event(trigger) -> dict:
    """What the triggerer hands a deferred task: the trigger's first event, after a serialize round trip (the
    triggerer rebuilds each trigger from its classpath and kwargs)."""
    import importlib

    from gpuflow.triggers import first_event as wait_for_first_event

    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    revived = getattr(importlib.import_module(module), name)(**kwargs)
    assert revived.serialize() == (classpath, kwargs)
    return wait_for_first_event(revived, timeout_s=3600)  # each test's own timeout (pytest-timeout) comes first


def dag_bag(folder: Path | None = None):
    """A DagBag of gpuflow's DAG files (or ``folder``'s): from airflow.dag_processing.dagbag, or, on Airflow 3.1
    (Composer's 3.1.8 line, make test-composer LINE=3.1.8), airflow.models.dagbag."""
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:
        from airflow.models.dagbag import DagBag
    return DagBag(str(folder or ROOT / "dags"))


def site_dag(config_file: str | Path, dag_name: str):
    """One of gpuflow's DAGs, made from ``config_file`` as a site's DAG file makes it (``gpuflow.site_dags``): its
    id is ``<site>__<dag_name>``. A run's conf cannot name a configuration file, so a test that needs a file's values
    runs the DAG of that file's site."""
    import os

    from gpuflow.site_dags import site_dag as make
    from gpuflow.sites import site_name

    dag_file = Path(os.environ["GPUFLOW_TEST_SITE_DAGS"]) / f"{site_name(config_file)}__{dag_name}.py"
    dag_file.write_text("import airflow.sdk  # noqa: F401\nfrom gpuflow.site_dags import site_dag\n\n"
                        f"dag = site_dag({str(config_file)!r}, {dag_name!r})\n")
    return make(str(config_file), dag_name)


def run_dag(dag_name: str, conf: dict, **test_kwargs):
    """``dag.test()`` of the gpuflow DAG ``dag_name`` of the site whose file ``conf["config_file"]`` names, with the
    rest of ``conf`` as the run's conf: a test's shorthand for "this site's DAG, this run" (a real conf names no
    file)."""
    conf = dict(conf)
    return site_dag(conf.pop("config_file"), dag_name).test(run_conf=conf, **test_kwargs)


def dag_forms() -> dict:
    """Each gpuflow DAG's trigger form (its FormLayout), as its DAG file declares it: {dag_id: layout}."""
    return dict(_dag_forms())


def _dag_forms() -> tuple:
    global _FORMS
    if _FORMS is None:
        from gpuflow.runs.trigger_form import dag_form

        bag = dag_bag()
        _FORMS = tuple(sorted((dag_id, dag_form(dag)) for dag_id, dag in bag.dags.items()))
    return _FORMS


_FORMS = None


def assert_all_labelled(calls, names) -> None:
    """Each create call carries the run's labels (gpuflow-run, and gpuflow-deployment for a deployment's)."""
    assert calls, "no create call was recorded"
    unlabelled = [(kind, name, labels) for kind, name, labels in calls if labels != names.labels]
    assert unlabelled == [], unlabelled


def site_config(name: str, base: str | Path = "configs/local.yaml", **values) -> str:
    """Write ``name`` into the deployment's site folder ($GPUFLOW_SITE_DIR: a folder of each test process's own, set
    by conftest.py): ``base``'s keys with ``values`` (dotted keys) over them; its path.

    A run's conf may set knobs only (gpuflow.runs.run_policy), so what a test needs beyond them (its emulators' ports, its
    state folder, its bucket, its models) goes into a configuration file, as a deployment manager's would."""
    import yaml

    from gpuflow.configuration.loading import _set_dotted, resolve_config_path
    from gpuflow.paths import site_dir

    data = yaml.safe_load(resolve_config_path(base).read_text()) or {}
    for dotted, value in values.items():
        _set_dotted(data, dotted, value)
    path = site_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def local_site_file() -> str:
    """The local profile's test configuration (the ``local_config`` fixture writes it)."""
    from gpuflow.paths import site_dir

    return str(site_dir() / "local.yaml")


class RecordingTI:
    """A task instance for an operator run outside Airflow: keeps what it pushes, pulls only that (preflight's
    rollout plan: none, an ephemeral run)."""

    def __init__(self) -> None:
        self.pushed: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.pushed[key] = value

    def xcom_pull(self, task_ids: Any = None, key: str = "return_value") -> Any:
        return self.pushed.get(key)


def wait_until(condition: Callable[[], Any], what: str, timeout_s: float = 60) -> None:
    """Poll ``condition`` until it holds; fail the test naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)
