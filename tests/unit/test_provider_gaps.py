"""Every "the provider lacks X" that gpuflow's code states, checked against the installed Google provider: 22.8.0 in
`make test`, Composer's floor 22.2.0 in `make test-composer LINE=3.1.8`. When a provider release adds the piece,
its test fails and names the claim and where it is made: use the provider's piece there, and delete the claim."""

from __future__ import annotations

import importlib
import inspect
from importlib import metadata

import pytest
from airflow.triggers.base import BaseTrigger

PROVIDER = metadata.version("apache-airflow-providers-google")


def own_on_kill(cls: type) -> list[str]:
    """The classes of ``cls``'s MRO, below BaseTrigger, that define on_kill."""
    return [klass.__qualname__ for klass in cls.__mro__ if klass is not BaseTrigger and "on_kill" in vars(klass)]


def parameters(function) -> set[str]:
    return set(inspect.signature(function).parameters)


def trigger(module: str, name: str) -> type | None:
    return getattr(importlib.import_module(f"airflow.providers.google.cloud.triggers.{module}"), name, None)


#: (where the claim is made, the provider's class, its module): triggers that wait without end and do not cancel
#: their job when the task is killed, so gpuflow adds a timeout and on_kill (triggers/cancelling.py, batch_input.py).
WAIT_WITHOUT_END = [
    ("triggers/cancelling.py", "vertex_ai", "CustomJobTrigger"),
    ("triggers/cancelling.py", "cloud_build", "CloudBuildCreateBuildTrigger"),
    ("triggers/cancelling.py", "dataproc", "DataprocBatchTrigger"),
    ("triggers/batch_input.py", "gcs", "GCSBlobTrigger"),
]


@pytest.mark.parametrize(("where", "module", "name"), WAIT_WITHOUT_END, ids=[name for _, _, name in WAIT_WITHOUT_END])
def test_these_provider_triggers_have_no_on_kill_and_no_timeout(where, module, name):
    cls = trigger(module, name)
    if cls is None:
        assert name == "CustomJobTrigger", f"{name} left the provider {PROVIDER}"  # (the floor's lack: below)
        return
    assert own_on_kill(cls) == [], f"provider {PROVIDER}: {name} cancels on kill now; {where} claims it does not"
    timeouts = {p for p in parameters(cls.__init__) if "timeout" in p}
    assert timeouts == set(), f"provider {PROVIDER}: {name} takes {timeouts}; {where} claims it has no timeout"


def test_the_floor_provider_has_no_custom_job_trigger():
    """triggers/vertex_custom_job.py copies 22.8.0's CustomJobTrigger for Composer's providers (22.2.0, 22.2.2)."""
    from gpuflow.catalog import composer_tested_lines

    floor_providers = {line["packages"]["apache-airflow-providers-google"] for line in composer_tested_lines().values()}
    has_it = trigger("vertex_ai", "CustomJobTrigger") is not None
    if PROVIDER in floor_providers:
        assert not has_it, f"provider {PROVIDER} has CustomJobTrigger: triggers/vertex_custom_job.py can go"
    else:
        assert has_it, f"provider {PROVIDER} lost CustomJobTrigger, which triggers/cancelling.py takes from it"


def test_the_providers_dataflow_triggers_wait_for_a_job_state_only():
    """triggers/dataflow.py: a GPU job is RUNNING long before a worker has a GPU, so gpuflow's trigger also reads the
    job's messages and autoscaling events (workers started, zones exhausted); the provider's read neither."""
    for name in ("TemplateJobStartTrigger", "DataflowJobStatusTrigger", "DataflowStartYamlJobTrigger"):
        cls = trigger("dataflow", name)
        if cls is None:
            continue
        source = inspect.getsource(cls)
        assert "list_job_messages" not in source and "autoscaling" not in source.lower(), (
            f"provider {PROVIDER}: {name} reads job messages now; triggers/dataflow.py claims it does not")


def test_the_providers_template_start_trigger_cancels_on_kill_from_22_8():
    """docs/architecture.md and triggers/dataflow.py say which provider cancels a Dataflow job on kill: 22.8.0's
    TemplateJobStartTrigger does (cancel_on_kill, on_kill); the floor's 22.2.0 does not."""
    cls = trigger("dataflow", "TemplateJobStartTrigger")
    cancels = "cancel_on_kill" in parameters(cls.__init__) and bool(own_on_kill(cls))
    newer = tuple(int(part) for part in PROVIDER.split(".")[:2]) >= (22, 8)
    assert cancels == newer, f"provider {PROVIDER}: TemplateJobStartTrigger cancels on kill: {cancels}"


def test_the_providers_template_launch_takes_no_update_fields():
    """platform/gcp_dataflow.py (update_pipeline): launch_job_with_template takes no ``update`` nor
    ``transformNameMapping``, so a direct launch's update goes through the hook's own client."""
    from airflow.providers.google.cloud.hooks.dataflow import DataflowHook

    taken = {p for p in parameters(DataflowHook.launch_job_with_template) if "update" in p or "mapping" in p}
    assert taken == set(), f"provider {PROVIDER}: launch_job_with_template takes {taken} now"


def test_the_provider_cannot_read_monitoring_time_series():
    """platform/gpu_metrics.py: no Cloud Monitoring hook that reads time series, and no Monitoring trigger."""
    try:
        hook = importlib.import_module("airflow.providers.google.cloud.hooks.cloud_monitoring")
    except ModuleNotFoundError:
        hook = None
    reads = hook is not None and any(hasattr(cls, "list_time_series") for _, cls in inspect.getmembers(hook,
                                                                                                        inspect.isclass))
    assert not reads, f"provider {PROVIDER} reads Monitoring time series now; platform/gpu_metrics.py claims not"
    import pkgutil

    import airflow.providers.google.cloud.triggers as triggers

    assert not [m.name for m in pkgutil.iter_modules(triggers.__path__) if "monitoring" in m.name]


def test_the_providers_create_custom_job_operator_starts_a_job_at_every_try():
    """docs/architecture.md (export_model): CreateCustomJobOperator is not in Composer's floor provider (22.2.0), and
    22.8.0's creates a new custom job at every try (it looks for none an earlier try started) and defers to
    CustomJobTrigger, which has neither a timeout nor a cancel on kill (above). gpuflow's export finds the run's job
    by its name and label, and waits in CancellingCustomJobTrigger."""
    from gpuflow.catalog import composer_tested_lines

    module = importlib.import_module("airflow.providers.google.cloud.operators.vertex_ai.custom_job")
    cls = getattr(module, "CreateCustomJobOperator", None)
    floor_providers = {line["packages"]["apache-airflow-providers-google"] for line in composer_tested_lines().values()}
    if cls is None:
        assert PROVIDER in floor_providers, f"provider {PROVIDER} has no CreateCustomJobOperator"
        return
    source = inspect.getsource(cls.execute)
    assert "create_custom_job" in source and "list_custom_jobs" not in source, (
        f"provider {PROVIDER}: CreateCustomJobOperator looks for an earlier try's job now; docs/architecture.md claims "
        "it does not")


def test_the_providers_link_classes_load_hundreds_of_modules():
    """operators/links.py: gpuflow's links are BaseOperatorLink subclasses, not the provider's BaseGoogleLink (whose
    persist any operator may call, and whose get_link gives "" when nothing is stored): importing
    airflow.providers.google.cloud.links.base from gpuflow's operator modules would load its modules in every forked
    parse, since the dag-processor pre-imports only the airflow.* modules a DAG file names. 22.8.0's loads 612
    (about 300 ms a parse here); Composer's floor, 22.2.0, loads 12."""
    import subprocess
    import sys

    code = ("import sys; import airflow.sdk; before = set(sys.modules); "
            "import airflow.providers.google.cloud.links.base; print(len(set(sys.modules) - before))")
    loaded = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                timeout=120).stdout.split()[-1])
    if tuple(int(part) for part in PROVIDER.split(".")[:2]) < (22, 8):  # Composer's 22.2.0: 12 modules
        return
    assert loaded > 200, (f"provider {PROVIDER}: its link base loads {loaded} modules now; operators/links.py can "
                          "use BaseGoogleLink subclasses")


def hook(module: str, name: str) -> type:
    return getattr(importlib.import_module(f"airflow.providers.google.cloud.hooks.{module}"), name)


#: (the hook, its synchronous wait): what a task with ``deferrable=False`` would wait through. None of them ends the
#: wait at a bound of its own and cancels the job, as gpuflow's triggers do, so such a task waits for the same
#: trigger in its worker (``JobWaitingOperator.wait_for``, operators/base.py).
SYNC_WAITS = [("vertex_ai.custom_job", "CustomJobHook", "wait_for_custom_job"),
              ("dataproc", "DataprocHook", "wait_for_batch"),
              ("dataflow", "DataflowHook", "wait_for_done")]


@pytest.mark.parametrize(("module", "name", "method"), SYNC_WAITS, ids=[method for _, _, method in SYNC_WAITS])
def test_the_hooks_synchronous_waits_have_no_bound_of_their_own_and_cancel_nothing(module, name, method):
    import re

    wait = getattr(hook(module, name), method, None)
    if wait is None:  # Composer's floor provider (22.2.0) has no such wait at all
        assert method == "wait_for_custom_job", f"provider {PROVIDER}: {name}.{method} is gone"
        return
    sources = [inspect.getsource(wait)]
    if method == "wait_for_done":  # the hook's wait is its jobs controller's, which reads job states only
        controller = importlib.import_module(wait.__module__)._DataflowJobsController
        sources += [inspect.getsource(controller.wait_for_done),
                    inspect.getsource(controller.job_reached_terminal_state)]
        assert not [source for source in sources[1:] if "message" in source or "autoscal" in source.lower()], (
            f"provider {PROVIDER}: the Dataflow hook's wait reads job messages now")
    # ``timeout`` is each request's own; a cancel_timeout bounds a cancel someone else asks for
    bounds = {p for p in parameters(wait) if "timeout" in p} - {"timeout"}
    cancels = [found for source in sources for found in re.findall(r"\.cancel\w*\(", source)]
    assert bounds == set() and cancels == [], (
        f"provider {PROVIDER}: {name}.{method} bounds its wait ({bounds}) or cancels ({cancels}) now; "
        "operators/base.py (wait_for) claims it does neither")


def test_the_cloud_build_hook_cannot_wait_on_a_build_by_its_id():
    """A retry finds an earlier try's build by its tag and has its id only, not the create operation that
    CloudBuildHook.wait_for_operation waits on; the hook has no wait by build id."""
    cloud_build = hook("cloud_build", "CloudBuildHook")
    waits = sorted(name for name in vars(cloud_build) if name.startswith("wait"))
    assert all("operation" in parameters(getattr(cloud_build, name)) for name in waits), (
        f"provider {PROVIDER}: CloudBuildHook has {waits}; operators/base.py (wait_for) claims no wait by build id")


def dataproc_operator(name: str) -> type:
    return getattr(importlib.import_module("airflow.providers.google.cloud.operators.dataproc"), name)


def test_the_providers_dataproc_create_batch_lacks_what_gpuflows_subclass_adds():
    """operators/dataproc.py (DataprocBatchOperator, PacedDataprocHook) claims three gaps of the provider's operator:
    its on_kill cancels only the operation its own create returned (none after a retry's AlreadyExists); it defers
    with no timeout, to DataprocBatchTrigger (no on_kill, no timeout: above); waiting in its worker, it calls
    wait_for_batch without its polling interval (the hook then polls every 10 s)."""
    import re

    create = dataproc_operator("DataprocCreateBatchOperator")
    on_kill = inspect.getsource(create.on_kill)
    assert "self.operation" in on_kill and "batch_id" not in on_kill, (
        f"provider {PROVIDER}: DataprocCreateBatchOperator.on_kill cancels by batch id now; DataprocBatchOperator's "
        "on_kill can go")
    execute = inspect.getsource(create.execute)
    (deferral,) = re.findall(r"self\.defer\((.*?)method_name", execute, re.DOTALL)
    assert "DataprocBatchTrigger(" in deferral and "timeout" not in deferral, (
        f"provider {PROVIDER}: DataprocCreateBatchOperator defers with a timeout now; DataprocBatchOperator.defer "
        "can go")
    assert "wait_check_interval" not in execute, (
        f"provider {PROVIDER}: DataprocCreateBatchOperator waits at its polling interval now; PacedDataprocHook can go")


def test_the_providers_dataproc_delete_batch_fails_on_a_batch_that_is_not_there():
    """operators/dataproc.py (DataprocCleanupOperator): the cleanup deletes through DataprocHook.delete_batch itself,
    since DataprocDeleteBatchOperator lets NotFound fail the task (a teardown after a failed submit finds none)."""
    source = inspect.getsource(dataproc_operator("DataprocDeleteBatchOperator").execute)
    assert "delete_batch" in source and "NotFound" not in source, (
        f"provider {PROVIDER}: DataprocDeleteBatchOperator accepts a missing batch now; DataprocCleanupOperator can "
        "be the provider's")
