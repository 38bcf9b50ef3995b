"""Every Dataflow option and request field of a gpuflow job, as pure functions (the CLI prints them too)."""

from __future__ import annotations

import re
import sys
from typing import Any

from gpuflow.configuration.loading import beam_jobs_dir
from gpuflow.configuration.model import ConfigError, GpuflowConfig
from gpuflow.dataflow.gpu_options import pipeline_machine_type, right_fitting
from gpuflow.runs.naming import ResourceNames


def service_options(config: GpuflowConfig) -> list[str]:
    """The configured service options, plus how the GPU is asked for.

    worker_accelerator: gpuflow's option unless one was written by hand. resource_hint: no worker_accelerator at all
    ("When you use right fitting, don't use the worker_accelerator service option") and no Dataflow Prime unless the
    configuration asks for it ("When you use a resource hint in your pipeline, right fitting is automatically
    enabled"; both docs.cloud.google.com/dataflow/docs/guides/right-fitting); the hint sits on the RunInference step.
    """
    from gpuflow.dataflow.gpu_options import PREFIX, worker_accelerator

    options = list(config.dataflow_service_options)
    if not config.uses_gpu or config.gpu.request == "resource_hint":  # CPU workers, or the GPU is in the hint
        return options
    if not any(option.startswith(PREFIX) for option in options):
        options.append(worker_accelerator(config))
    return options


#: The right-fitting page (docs.cloud.google.com/dataflow/docs/guides/right-fitting): "Right fitting is supported with
#: streaming pipelines with horizontal autoscaling enabled. You can enable it by setting the
#: --experiments=enable_streaming_rightfitting pipeline option."
STREAMING_RIGHT_FITTING = "enable_streaming_rightfitting"


def experiments(config: GpuflowConfig, streaming: bool) -> list[str]:
    from gpuflow.dataflow.gpu_options import effective_sharing

    chosen = ["use_runner_v2", *config.dataflow.experiments]
    if effective_sharing(config) == "single_process" and "no_use_multiple_sdk_containers" not in chosen:
        chosen.append("no_use_multiple_sdk_containers")
    if streaming and right_fitting(config) and STREAMING_RIGHT_FITTING not in chosen:
        chosen.append(STREAMING_RIGHT_FITTING)
    return chosen


#: Dataflow's rule for a job name: the Job resource's "name" field in Dataflow's REST reference
#: (cloud.google.com/dataflow/docs/reference/rest/v1b3/projects.jobs#Job): "must match the regular expression
#: [a-z]([-a-z0-9]{0,1022}[a-z0-9])?".
DATAFLOW_JOB_NAME = re.compile(r"[a-z]([-a-z0-9]{0,1022}[a-z0-9])?")


def job_name_for(names: ResourceNames, config: GpuflowConfig, kind: str) -> str:
    """Unique per GPU placement, so a fallback never collides with the job it replaces; checked to Dataflow's rule
    here, before any request carries it."""
    gpu = config.gpu.type.removeprefix("nvidia-").removeprefix("tesla-") if config.uses_gpu else "cpu"
    name = f"{names.job_prefix or names.prefix}-{kind}-{config.region}-{gpu}"[:63].rstrip("-")
    if not DATAFLOW_JOB_NAME.fullmatch(name):
        raise ConfigError(f"the Dataflow job name {name!r} (from region and gpu.type) breaks Dataflow's rule "
                          f"{DATAFLOW_JOB_NAME.pattern}. Fix: set region and gpu.type to Google's names.")
    return name


def template_uri_for(names: ResourceNames, job_name: str) -> str:
    return names.gcs_uri("templates", f"{job_name}.json")


def dataflow_options(config: GpuflowConfig, names: ResourceNames, image: str, job_name: str,
                     streaming: bool, template_uri: str | None) -> list[str]:
    """Every DataflowRunner option of a gpuflow job: Runner v2, the GPU, the image, the worker pool."""
    options = [
        "--runner=DataflowRunner",
        f"--project={config.project}",
        f"--region={config.region}",
        f"--job_name={job_name}",
        f"--temp_location={names.gcs_uri('tmp')}",
        f"--staging_location={names.gcs_uri('staging')}",
        f"--sdk_container_image={image}",
        "--sdk_location=container",
        f"--disk_size_gb={config.worker.disk_size_gb}",
        f"--max_num_workers={config.worker.max_num_workers}",
        *(f"--experiments={experiment}" for experiment in experiments(config, streaming)),
        *(f"--dataflow_service_options={option}" for option in service_options(config)),
        *(f"--labels={key}={value}" for key, value in names.labels.items()),
    ]
    machine_type = pipeline_machine_type(config)
    if machine_type:
        options.append(f"--machine_type={machine_type}")
    if streaming:
        # Streaming Engine, stated rather than left to a default: streaming autoscaling (and so streaming right
        # fitting) needs it (docs.cloud.google.com/dataflow/docs/horizontal-autoscaling).
        options += ["--streaming", "--enable_streaming_engine"]
    if config.dataflow.service_account:
        options.append(f"--service_account_email={config.dataflow.service_account}")
    if config.dataflow.network:
        options.append(f"--network={config.dataflow.network}")
    if config.dataflow.subnetwork:
        options.append(f"--subnetwork={config.dataflow.subnetwork}")
    if not config.dataflow.use_public_ips:
        options.append("--no_use_public_ips")
    if config.gpu.zone:
        options.append(f"--worker_zone={config.gpu.zone}")
    if template_uri:
        options.append(f"--template_location={template_uri}")
    return options


def argv_pairs(argv: list[str]) -> list[tuple[str, Any]]:
    """``--name value``, ``--name=value`` and bare ``--flag`` arguments as (name, value) pairs (flags: True)."""
    pairs: list[tuple[str, Any]] = []
    tokens = list(argv)
    while tokens:
        name, equals, given = tokens.pop(0).removeprefix("--").partition("=")
        value: str | bool = given
        if not equals:
            value = tokens.pop(0) if tokens and not tokens[0].startswith("--") else True
        pairs.append((name, value))
    return pairs


def staging_variables(config: GpuflowConfig, names: ResourceNames, argv: list[str], image: str, job_name: str,
                      streaming: bool) -> dict[str, Any]:
    """The pipeline's arguments and every Dataflow option as BeamHook's ``variables`` (repeated ones as lists).

    BeamHook writes them back as ``--name=value`` after ``--runner=DataflowRunner``, which it adds itself."""
    options = dataflow_options(config, names, image, job_name, streaming, template_uri_for(names, job_name))
    variables: dict[str, Any] = {}
    for name, value in argv_pairs([*argv, *options]):
        if name in variables:
            previous = variables[name]
            variables[name] = [*(previous if isinstance(previous, list) else [previous]), value]
        else:
            variables[name] = value
    del variables["runner"]
    # BeamHook takes the job's labels as a mapping and writes each back as --labels=key=value.
    labels = variables["labels"] if isinstance(variables["labels"], list) else [variables["labels"]]
    variables["labels"] = dict(label.split("=", 1) for label in labels)
    return variables


def staging_command(config: GpuflowConfig, names: ResourceNames, script: str, argv: list[str], image: str,
                    job_name: str, streaming: bool) -> list[str]:
    """The command BeamHook runs so that Beam's DataflowRunner writes a job's request to GCS (it starts nothing)."""
    from airflow.providers.apache.beam.hooks.beam import beam_options_to_args

    variables = staging_variables(config, names, argv, image, job_name, streaming)
    # As BeamHook.start_python_pipeline turns the labels mapping back into key=value arguments.
    variables["labels"] = [f"{key}={value}" for key, value in variables["labels"].items()]
    return [sys.executable, str(beam_jobs_dir() / script), "--runner=DataflowRunner", *beam_options_to_args(variables)]


def gpu_metric_filter(metric_type: str, job_id: str) -> str:
    """A Cloud Monitoring filter for one Dataflow job's GPU metric.

    Dataflow's job GPU metrics (guide 000's "GPU utilization" and "GPU memory utilization" under resource type
    "Dataflow Job") are written on the monitored resource ``dataflow_job`` with the job id as the *metric*
    label ``job_id`` (docs.cloud.google.com/monitoring/api/metrics_gcp_d_h, section dataflow).
    """
    return f'metric.type = "{metric_type}" AND resource.type = "dataflow_job" AND metric.labels.job_id = "{job_id}"'


def runtime_environment(config: GpuflowConfig, names: ResourceNames, streaming: bool) -> Any:
    """The launch-time environment: the same worker pool as the staged request, stated again at launch."""
    from google.cloud import dataflow_v1beta3

    return dataflow_v1beta3.RuntimeEnvironment(**worker_pool_fields(config, names, streaming))


def worker_pool_fields(config: GpuflowConfig, names: ResourceNames, streaming: bool) -> dict[str, Any]:
    """The fields a classic and a Flex Template launch both state about the workers.

    ``enable_streaming_engine`` is true for a streaming job: the field's default is false ("The default value is
    false", docs.cloud.google.com/dataflow/docs/reference/pipeline-options, enableStreamingEngine, "Supported in Flex
    Templates"), and streaming autoscaling, which streaming right fitting needs, runs on Streaming Engine
    (docs.cloud.google.com/dataflow/docs/horizontal-autoscaling)."""
    return {
        "max_workers": config.worker.max_num_workers,
        "machine_type": pipeline_machine_type(config) or "",
        "disk_size_gb": config.worker.disk_size_gb,
        "temp_location": names.gcs_uri("tmp"),
        "service_account_email": config.dataflow.service_account or "",
        "network": config.dataflow.network or "",
        "subnetwork": config.dataflow.subnetwork or "",
        "ip_configuration": "WORKER_IP_PUBLIC" if config.dataflow.use_public_ips else "WORKER_IP_PRIVATE",
        "worker_zone": config.gpu.zone or "",
        "additional_experiments": experiments(config, streaming),
        "additional_user_labels": names.labels,
        "enable_streaming_engine": streaming,
    }


def flex_parameters(job: str, argv: list[str], config: GpuflowConfig) -> dict[str, str]:
    """A gpuflow job's arguments as Flex Template parameters: ``--max-new-tokens 16`` -> max_new_tokens=16.

    The launcher passes each back as ``--max_new_tokens=16``; bare flags become ``true``."""
    parameters = {"gpuflow_job": job}
    for name, value in argv_pairs(argv):
        parameters[name.replace("-", "_")] = "true" if value is True else value
    parameters["dataflow_service_options"] = ",".join(service_options(config))
    return parameters


def flex_template_spec(image: str, parameter_names: list[str]) -> dict[str, Any]:
    """The Flex Template file: the image that launches (and runs) the job, and the parameters it takes."""
    return {
        "image": image,
        "sdkInfo": {"language": "PYTHON"},
        "metadata": {
            "name": "gpuflow",
            "description": "gpuflow's Beam jobs (llm_inference, gpu_check), launched from their own worker image",
            "parameters": [{"name": name, "label": name, "helpText": f"gpuflow job argument {name}",
                            "isOptional": name != "gpuflow_job"} for name in parameter_names],
        },
    }


def flex_runtime_environment(config: GpuflowConfig, names: ResourceNames, image: str, streaming: bool) -> Any:
    from google.cloud import dataflow_v1beta3

    return dataflow_v1beta3.FlexTemplateRuntimeEnvironment(
        **worker_pool_fields(config, names, streaming), staging_location=names.gcs_uri("staging"), sdk_container_image=image)


def flex_launch(config: GpuflowConfig, names: ResourceNames, job: str, argv: list[str], image: str,
                job_name: str, streaming: bool) -> tuple[dict[str, Any], Any]:
    """The Flex Template file and the LaunchFlexTemplateRequest that starts it (the CLI prints the request)."""
    from google.cloud import dataflow_v1beta3

    parameters = flex_parameters(job, argv, config)
    request = dataflow_v1beta3.LaunchFlexTemplateRequest(
        project_id=config.project, location=config.region,
        launch_parameter=dataflow_v1beta3.LaunchFlexTemplateParameter(
            job_name=job_name, container_spec_gcs_path=names.gcs_uri("templates", f"{job_name}.flex.json"),
            parameters=parameters, environment=flex_runtime_environment(config, names, image, streaming)),
    )
    return flex_template_spec(image, sorted(parameters)), request


def sdk_python_of(template: dict[str, Any]) -> str | None:
    """The launcher's Python minor version, as Beam wrote it into the job request ("Apache Beam Python 3.11 SDK")."""
    agent = template.get("environment", {}).get("userAgent", {}).get("name", "")
    found = re.search(r"Python (\d+\.\d+)", agent)
    return found.group(1) if found else None
