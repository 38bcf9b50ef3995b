"""The opening every inference DAG shares: the GPU quota, the run's resources, the weights, the image, the GPU check.

One factory, so that the streaming and the batch DAG cannot drift apart. The group keeps the tasks' own ids
(``prefix_group_id=False``): a DAG run's task ids, XComs and links are the same as without it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow.sdk import TaskGroup

from gpuflow.operators.streaming import (
    STATE_DICT_ASSET,
    BuildContainerOperator,
    ExportModelOperator,
    QuotaCheckOperator,
    SetupResourcesOperator,
    VerifyGpuOperator,
)
from gpuflow.workflow_names import GPU_POOL


@dataclass(frozen=True)
class Preparation:
    group: TaskGroup
    setup: SetupResourcesOperator  # a teardown's setup: the run's resources are deleted whatever happens
    build_container: BuildContainerOperator  # its output is the image the jobs run


def preparation(config_json: Any, setup: type[SetupResourcesOperator] = SetupResourcesOperator) -> Preparation:
    """check_quota >> setup >> export_model >> build_container >> verify_gpu, in a group named ``prepare``."""
    with TaskGroup("prepare", prefix_group_id=False,
                   tooltip="quota, the run's topics and buckets, the weights, the image, the GPU check") as group:
        check_quota = QuotaCheckOperator(task_id="check_quota", config_json=config_json)
        setup_task = setup(task_id="setup", config_json=config_json)
        export_model = ExportModelOperator(task_id="export_model", config_json=config_json, outlets=[STATE_DICT_ASSET])
        build_container = BuildContainerOperator(task_id="build_container", config_json=config_json)
        verify_gpu = VerifyGpuOperator(task_id="verify_gpu", config_json=config_json, image=build_container.output,
                                       pool=GPU_POOL)
        check_quota >> setup_task >> export_model >> build_container >> verify_gpu
    return Preparation(group, setup_task, build_container)
