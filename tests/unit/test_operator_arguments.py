"""Each gpuflow operator takes only what it uses: an argument it would ignore is refused when the DAG is parsed."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest

from gpuflow.operators import batch, dataproc, deployment, quota_report, streaming

MODULES = (streaming, batch, deployment, dataproc, quota_report)
OPERATORS = sorted({cls for module in MODULES for _, cls in inspect.getmembers(module, inspect.isclass)
                    if cls.__module__.startswith("gpuflow.operators") and cls.__name__.endswith("Operator")},
                   key=lambda cls: cls.__name__)


def own_arguments(cls: type) -> set[str]:
    """The keyword arguments gpuflow's own __init__s in the class's MRO take."""
    return {name for klass in cls.__mro__ if klass.__module__.startswith("gpuflow.") and "__init__" in vars(klass)
            # (Airflow's metaclass also sets an inherited __init__, wrapped, on a class that defines none)
            and vars(klass)["__init__"].__qualname__ == f"{klass.__qualname__}.__init__"
            for name, parameter in inspect.signature(klass.__init__).parameters.items()
            if name != "self" and parameter.kind is parameter.KEYWORD_ONLY}


def attributes_read(cls: type) -> set[str]:
    """``self.X`` read anywhere in the gpuflow classes of the MRO, outside their __init__s."""
    read = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("gpuflow."):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef) and function.name != "__init__":
                read |= {node.attr for node in ast.walk(function) if isinstance(node, ast.Attribute)
                         and isinstance(node.value, ast.Name) and node.value.id == "self"
                         and isinstance(node.ctx, ast.Load)}
    # a provider operator's own arguments, which a gpuflow subclass passes on to its __init__
    read |= {name for klass in cls.__mro__ if klass.__module__.startswith("airflow.providers.")
             and "__init__" in vars(klass) for name in inspect.signature(klass.__init__).parameters}
    # PlainArguments.trusted_config reads each plain argument by name (getattr), from these two mappings
    from gpuflow.operators.base import PlainArguments

    if issubclass(cls, PlainArguments):
        read |= set(cls.provider_arguments) | set(cls.job_arguments)
    return read


@pytest.mark.parametrize("cls", OPERATORS, ids=lambda cls: cls.__name__)
def test_every_argument_an_operator_takes_is_one_it_reads(cls):
    unread = own_arguments(cls) - attributes_read(cls)
    assert unread == set(), f"{cls.__name__} takes {sorted(unread)} and never reads them"


@pytest.mark.parametrize(("cls", "argument"), [
    (streaming.QuotaCheckOperator, {"image": "x"}),
    (streaming.QuotaCheckOperator, {"deferrable": False}),
    (streaming.SetupResourcesOperator, {"launch_task_id": "launch"}),
    (streaming.ExportModelOperator, {"image": "x"}),
    (batch.PublishOutputsOperator, {"cancel_on_kill": False}),
    (dataproc.DataprocCleanupOperator, {"poll_interval": 5}),
])
def test_an_argument_an_operator_would_ignore_is_refused(cls, argument):
    with pytest.raises(TypeError, match="Invalid arguments"):
        cls(task_id="t", **argument)


@pytest.mark.parametrize("site", ["True", "False"])
def test_deferrable_defaults_to_airflows_operators_default_deferrable(monkeypatch, site):
    """As the provider's operators: the site's ``[operators] default_deferrable`` unless the DAG says."""
    monkeypatch.setenv("AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE", site)
    waiting = [cls for cls in OPERATORS if "deferrable" in own_arguments(cls)]
    assert len(waiting) >= 10, [cls.__name__ for cls in waiting]
    given = {"config_json": "{{ ti.xcom_pull('preflight') }}"}  # what the Dataproc batch needs to be built
    for cls in waiting:
        assert cls(task_id="t", **given).deferrable is (site == "True"), cls.__name__
        assert cls(task_id="t", deferrable=site != "True", **given).deferrable is (site != "True"), cls.__name__


def documented(cls: type) -> set[str]:
    """The ``:param X:`` the gpuflow classes of the MRO document."""
    import re

    return {name for klass in cls.__mro__ if klass.__module__.startswith("gpuflow.")
            for name in re.findall(r":param (\w+):", klass.__doc__ or "")}


@pytest.mark.parametrize("cls", OPERATORS, ids=lambda cls: cls.__name__)
def test_every_argument_an_operator_takes_is_documented_with_param(cls):
    undocumented = own_arguments(cls) - documented(cls)
    assert undocumented == set(), f"{cls.__name__}'s docstring has no :param for {sorted(undocumented)}"


def test_plain_arguments_build_the_configuration_and_a_bad_one_names_the_argument():
    """A team's DAG without a gpuflow configuration file: gpuflow's defaults with the arguments set."""
    from gpuflow.operators.airflow_names import AirflowFailException

    quota = streaming.QuotaCheckOperator(task_id="q", project_id="team-proj-1", region="europe-west4",
                                         impersonation_chain="ml@team-proj-1.iam.gserviceaccount.com",
                                         gpu_count="2", max_num_workers=3)
    config = quota.trusted_config({})
    assert (config.profile, config.project, config.region, config.gpu.count, config.worker.max_num_workers) == (
        "gcp", "team-proj-1", "europe-west4", 2, 3)
    assert config.impersonation_chain == ["ml@team-proj-1.iam.gserviceaccount.com"]
    with pytest.raises(AirflowFailException, match=r"gpu_count \(gpu.count\): .* Fix: set gpu_count "):
        streaming.QuotaCheckOperator(task_id="q", project_id="team-proj-1", gpu_count="many").trusted_config({})
    with pytest.raises(AirflowFailException, match="neither config_json nor project_id"):
        streaming.VerifyGpuOperator(task_id="v", image="img").trusted_config({})
    assert streaming.VerifyGpuOperator(task_id="v", profile="local").trusted_config({}).profile == "local"


def test_a_waiting_operators_poll_interval_is_the_configurations_with_plain_arguments():
    """Every trigger the task builds (the job's, Cloud Monitoring's) polls at it; templated, it arrives as text."""
    smoke = streaming.SmokeTestOperator(task_id="s", project_id="team-proj-1", poll_interval="2")
    assert smoke.trusted_config({}).dataflow.poll_interval_s == 2.0
    assert "poll_interval" in smoke.template_fields
    from gpuflow.configuration.model import DataflowConfig

    default = streaming.SmokeTestOperator(task_id="s", project_id="team-proj-1").trusted_config({})
    assert default.dataflow.poll_interval_s == DataflowConfig().poll_interval_s  # gpuflow's default
    # Faster than the site's limits.min_poll_interval_s (gpuflow's default, 1 s): refused, as preflight would
    from gpuflow.operators.airflow_names import AirflowFailException

    with pytest.raises(AirflowFailException, match=r"poll_interval \(dataflow.poll_interval_s\): 0.01 s is shorter "
                                                   r"than limits.min_poll_interval_s .* Fix: set "):
        streaming.SmokeTestOperator(task_id="s", project_id="team-proj-1", poll_interval="0.01").trusted_config({})


def test_the_local_profile_with_plain_arguments_reaches_the_emulators_the_standard_variables_name(monkeypatch):
    """As Google's client libraries read them and ``gpuflow emulators run`` sets them; else gpuflow's defaults."""
    from gpuflow.configuration.model import LocalConfig

    export = streaming.ExportModelOperator(task_id="e", profile="local", bucket="team-bucket")
    monkeypatch.delenv("PUBSUB_EMULATOR_HOST", raising=False)
    monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
    defaults = LocalConfig()
    assert export.trusted_config({}).local.pubsub_emulator_host == defaults.pubsub_emulator_host
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", "localhost:18085")
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://localhost:19023")
    local = export.trusted_config({}).local
    assert (local.pubsub_emulator_host, local.storage_emulator_host) == ("localhost:18085", "http://localhost:19023")
    gcp = streaming.ExportModelOperator(task_id="e", project_id="team-proj-1", bucket="team-bucket")
    assert gcp.trusted_config({}).local.storage_emulator_host == defaults.storage_emulator_host  # gcp: not read


@pytest.mark.parametrize("cls", [batch.BatchSetupOperator, batch.RunBatchOperator, batch.BatchCleanupOperator,
                                 deployment.TeardownOperator, deployment.JanitorOperator],
                         ids=lambda cls: cls.__name__)
def test_an_operator_that_acts_on_a_gpuflow_configuration_only_refuses_plain_arguments(cls):
    """A batch run's filled paths or a deployment's record come from a gpuflow configuration, never from defaults."""
    with pytest.raises(TypeError, match="takes config_json .*, not plain arguments: bucket, project_id"):
        cls(task_id="t", project_id="team-proj-1", bucket="team-bucket")


def test_config_json_and_plain_arguments_exclude_each_other():
    with pytest.raises(TypeError, match="config_json .* or plain arguments, not both: gpu_type, project_id"):
        streaming.VerifyGpuOperator(task_id="v", config_json="{{ ti.xcom_pull('preflight') }}", project_id="p",
                                    gpu_type="nvidia-l4")
