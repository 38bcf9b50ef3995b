"""No task trusts an XCom that whoever may trigger can edit: preflight's rollout plan must match the deployment's
record (gpuflow.operators.base.rollout_plan), and a deployment belongs to its configuration file
(gpuflow.runs.rollout.owner_problem). The configuration XCom's own check runs through the REST API of a live Airflow
(tests/integration/test_airflow_live.py)."""

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.operators.airflow_names import AirflowFailException
from gpuflow.operators.base import ROLLOUT_KEY, rollout_plan
from gpuflow.platform.records import Records
from gpuflow.runs.naming import resource_names
from gpuflow.runs.rollout import DeploymentRecord, RolloutPlan, owner_problem
from tests.helpers import site_config

pytestmark = pytest.mark.timeout(60)


class Dag:
    """What rollout_plan reads of the DAG: its preflight task, that of a streaming DAG."""

    def __init__(self):
        from gpuflow.operators.streaming import PreflightOperator

        self.task_dict = {"preflight": PreflightOperator(task_id="preflight")}


class PushedBy:
    """A task instance whose XCom pull answers what preflight pushed (or what someone edited it into)."""

    def __init__(self, pushed):
        self.pushed = pushed

    def xcom_pull(self, task_ids, key):
        assert key == ROLLOUT_KEY
        return self.pushed


@pytest.fixture
def deployment(tmp_path):
    config = load_config(site_config("plan.yaml", **{
        "local.state_dir": str(tmp_path), "deployment.mode": "persistent", "deployment.name": "chat",
        "limits.lasting_deployments": True}))
    record = DeploymentRecord(
        name="chat", job={"kind": "local-process", "id": "111", "name": "gfd-chat-job", "location": "local"},
        job_name="gfd-chat-job", subscription="gfd-chat-prompts-sub", image="cpu", model_version="v1",
        model_dir_uri="gs://b/m", state_dict_uri="gs://b/m/sd", options={}, changed_by="manual__before",
        config_file=config.source_file)
    Records(config, "unused").write(record)
    return config, resource_names(config, "gf-0000000001"), record


def test_the_plan_preflight_pushed_is_read(deployment):
    config, names, record = deployment
    plan = RolloutPlan(path="weights", why="w", record=record)
    context = {"ti": PushedBy(plan.model_dump(mode="json")), "run_id": "manual__now", "dag": Dag()}
    assert rollout_plan(context, config, names, "unused") == plan


@pytest.mark.parametrize("edit", ["another job", "another deployment", "deleted", "ephemeral"])
def test_an_edited_plan_is_refused(deployment, edit):
    config, names, record = deployment
    plan = RolloutPlan(path="weights", why="w", record=record).model_dump(mode="json")
    if edit == "another job":
        plan["record"]["job"]["id"] = "999"  # another team's job
    elif edit == "another deployment":
        plan["record"]["name"] = "prod"
    elif edit == "deleted":
        plan = None
    else:
        config = config.model_copy(update={"deployment": config.deployment.model_copy(update={"mode": "ephemeral"})})
    with pytest.raises(AirflowFailException, match="This task did nothing"):
        rollout_plan({"ti": PushedBy(plan), "run_id": "manual__now", "dag": Dag()}, config, names, "unused")


def test_a_deployment_belongs_to_its_configuration_file(deployment):
    config, _, record = deployment
    assert owner_problem(record, config, "tear down") is None
    other = load_config(site_config("other-team.yaml", config.source_file))
    problem = owner_problem(record, other, "tear down")
    assert problem and record.config_file in problem and other.source_file in problem and "Fix:" in problem
    assert owner_problem(record.model_copy(update={"config_file": ""}), other, "roll out onto") is None  # unowned
