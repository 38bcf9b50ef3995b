"""The one typed configuration of a gpuflow workflow.

It is loaded once (YAML file, then the DAG run's Params, then ``--set`` overrides),
validated once, and then passed everywhere as a ``GpuflowConfig`` or its JSON dump.
Nothing else in gpuflow reads environment variables for settings.
"""

from __future__ import annotations

import ipaddress
import re
import string
import unicodedata
from pathlib import PurePath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from gpuflow.configuration.profiles import PROFILES, ProfileTraits
from gpuflow.paths import project_path
from gpuflow.sites import SITE_NAME

DEFAULT_CONFIG_FILE = project_path("configs/local.yaml")

#: The model name that means "the small seq2seq model gpuflow builds offline".
DEMO_MODEL_NAME = "gpuflow-demo"
#: The small decoder-only (Llama-shaped) model gpuflow builds offline.
DEMO_CAUSAL_MODEL_NAME = "gpuflow-demo-causal"
#: Each offline demo model and its architecture.
DEMO_MODELS = {DEMO_MODEL_NAME: "seq2seq", DEMO_CAUSAL_MODEL_NAME: "causal"}


class ConfigError(ValueError):
    """A configuration problem, phrased so that the message names the field and the fix."""


#: Control characters (newline, escape, NUL…) make a value print as two shell lines or hide what a log shows; format
#: characters (U+202E right-to-left override, zero-width spaces…) make a log line read differently from what it is.
#: No configuration value needs either: Unicode's categories Cc and Cf (``unsafe_character``) are refused everywhere.
UNSAFE_CATEGORIES = ("Cc", "Cf")


def unsafe_character(text: str) -> str | None:
    """The first character of Unicode category Cc or Cf in ``text``, as U+XXXX; None when there is none."""
    for character in text:
        if unicodedata.category(character) in UNSAFE_CATEGORIES:
            return f"U+{ord(character):04X}"
    return None


def _no_control_characters(value: Any) -> Any:
    texts = [value]
    while texts:
        text = texts.pop()
        if isinstance(text, dict):
            texts.extend([*text.keys(), *text.values()])
        elif isinstance(text, list):
            texts.extend(text)
        elif isinstance(text, str) and (found := unsafe_character(text)):
            raise ValueError(f"must not hold control characters (a newline, a tab, an escape) or format characters "
                             f"(a right-to-left override, a zero-width space); found {found}")
    return value


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @field_validator("*")
    @classmethod
    def _printable(cls, value: Any) -> Any:
        return _no_control_characters(value)


def _bucket_rule(name: str) -> str:
    """Cloud Storage's bucket name requirements (cloud.google.com/storage/docs/naming-buckets, "Bucket name
    requirements"): lowercase letters, digits, '-', '_' and '.'; a letter or digit first and last; 3-63 characters
    (gpuflow takes none of the longer dotted names, up to 222); not an IP address in dotted-decimal notation; not
    starting with "goog"; not containing "google" (nor a close misspelling, which gpuflow cannot list). A name with a
    dot, at any length, can be created only by an owner of its domain ("Bucket names containing dots require
    verification", the same page): preflight warns (``rules.dotted_bucket_needs_verification``)."""
    if not re.fullmatch(r"[a-z0-9][a-z0-9._-]{1,61}[a-z0-9]", name) or ".." in name:
        raise ValueError("must be a GCS bucket name: 3-63 lowercase letters, digits, '-', '_' or '.', starting and "
                         "ending with a letter or digit")
    try:
        ipaddress.ip_address(name)
        is_address = True
    except ValueError:
        is_address = False
    if is_address or name.startswith("goog") or "google" in name:
        raise ValueError("must not look like an IP address, start with 'goog' or contain 'google' (Cloud Storage "
                         "refuses such names)")
    return name


#: Pub/Sub's rule for a topic or subscription id (the Topic and Subscription resources' "name" field in Pub/Sub's
#: REST reference, cloud.google.com/pubsub/docs/reference/rest/v1/projects.topics): a letter first, then letters,
#: digits, '-', '_', '.', '~', '+' or '%'; 3 to 255 characters; not starting with "goog".
PUBSUB_ID = re.compile(r"[A-Za-z][A-Za-z0-9._~+%-]{2,254}")
#: The longest prefix gpuflow puts before a base name: a deployment's ``gfd-<24 characters>-``; a local job
#: subscription also gets ``-<10 hex>`` after it.
PUBSUB_PREFIX_MAX = len("gfd-") + 24 + 1
PUBSUB_SUFFIX_MAX = 11


class ModelConfig(_Section):
    name: str = Field(
        DEMO_MODEL_NAME,
        description=(
            "Hugging Face model, seq2seq or decoder-only: a hub name, a local directory, or "
            f"'{DEMO_MODEL_NAME}' (a small T5) or '{DEMO_CAUSAL_MODEL_NAME}' (a small Llama-shaped model), which "
            "gpuflow builds offline."
        ),
    )
    architecture: Literal["auto", "seq2seq", "causal"] = Field("auto", description=(
        "seq2seq (T5 class) or causal (decoder-only: Gemma, Llama, Mistral class); auto reads the model's config."))
    chat_template: bool = Field(False, description=(
        "Format each prompt with the tokenizer's chat template, as one user message (instruction-tuned causal "
        "models)."))
    max_new_tokens: int = Field(16, ge=1, le=4096, description="Tokens generated per answer (greedy decoding).")
    max_input_tokens: int = Field(
        512, ge=1, le=32768, description="Longer prompts go to the dead-letter topic instead of the model."
    )
    parameters_m: float | None = Field(
        None, gt=0, description="Model size in millions of parameters, for models the catalog does not know."
    )
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description=(
            "Inference dtype. 'auto' is bfloat16 on GPUs that support it and float32 elsewhere. "
            "float16 is not offered: T5 models overflow to NaN in fp16."
        ),
    )


def has_dot_segment(path: str) -> bool:
    """A '.' or '..' segment: a job would resolve it (a Vertex AI job's bucket mount, a local file system) and write
    outside the folder the configuration names."""
    return any(part in (".", "..") for part in path.removeprefix("gs://").split("/"))


def no_dot_segments(path: str) -> str:
    if has_dot_segment(path):
        raise ValueError("must not hold a '.' or '..' segment; write the folder's full path")
    return path


#: Compute Engine's region and zone names (cloud.google.com/compute/docs/regions-zones: "us-central1",
#: "us-central1-a"): lowercase words joined by hyphens, a number last; a zone adds "-" and a letter.
REGION = re.compile(r"[a-z]+(-[a-z]+)*[0-9]{1,2}")
ZONE = re.compile(REGION.pattern + r"-[a-z]")


def _matches(pattern: re.Pattern[str], what: str, value: str | None) -> str | None:
    if value is not None and not pattern.fullmatch(value):
        raise ValueError(f"must be a {what} name such as {'us-central1-a' if pattern is ZONE else 'us-central1'}")
    return value


class GpuFallback(_Section):
    """One alternative tried, in order, when the launch meets ZONE_RESOURCE_POOL_EXHAUSTED."""

    region: str | None = Field(None, description="Another region (keeps the GPU if empty).")
    type: str | None = Field(None, description="Another GPU type (keeps the region if empty).")
    machine_type: str | None = Field(None, description="The machine type that fits the fallback GPU.")

    @field_validator("region")
    @classmethod
    def _region(cls, value: str | None) -> str | None:
        return _matches(REGION, "region", value)


#: gpu.type for CPU workers: guide 002's own pipeline, which runs on CPU, on n2-highmem workers sized by its table.
NO_GPU = "none"


class GpuConfig(_Section):
    type: str = Field("nvidia-l4", description=(
        "Dataflow accelerator name, e.g. nvidia-l4 or nvidia-tesla-t4; none: CPU workers (set gpu.machine_type to "
        "the n2-highmem type guide 002 gives for the model, require_gpu: false)."))
    count: int = Field(1, ge=1, le=16, description="GPUs per worker.")
    machine_type: str = Field("g2-standard-4", description="Worker machine type; it must fit the GPU type.")
    zone: str | None = Field(
        None, description="Pin the workers to one zone. Empty (recommended): Dataflow picks a zone with capacity."
    )
    fallbacks: list[GpuFallback] = Field(
        default_factory=list,
        description="Tried in order on ZONE_RESOURCE_POOL_EXHAUSTED; each is checked by preflight first.",
    )
    request: Literal["worker_accelerator", "resource_hint"] = Field(
        "worker_accelerator",
        description=(
            "worker_accelerator: every worker gets the GPU (the worker_accelerator service option). resource_hint: "
            "right fitting, the accelerator hint (with the GPU's machine type) on the RunInference step only, the "
            "other steps on CPU workers of worker.machine_type. Never both."
        ),
    )
    sharing: Literal["auto", "single_process", "mps", "model_copies"] = Field(
        "auto",
        description=(
            "How SDK processes share the GPU. single_process: no_use_multiple_sdk_containers (one copy). mps: NVIDIA "
            "MPS (more than one vCPU; each process still loads its own copy). model_copies: gpu.model_copies copies "
            "shared across processes. auto: Dataflow's default (one process and one copy per vCPU) when those copies "
            "fit the GPU together, else single_process; with vLLM, the default (one server per worker)."
        ),
    )
    model_copies: int = Field(1, ge=1, le=16, description="With sharing: model_copies, RunInference's model copies.")

    @field_validator("zone")
    @classmethod
    def _zone(cls, value: str | None) -> str | None:
        return _matches(ZONE, "zone", value or None)


class WorkerConfig(_Section):
    machine_type: str | None = Field(None, description=(
        "gpu.request resource_hint: the CPU machine type of the steps without the GPU hint (the pipeline's "
        "--machine_type). Empty: guide 002's n2-highmem type for the model. Not sent with Dataflow Prime, which "
        "picks its own."))
    disk_size_gb: int = Field(50, ge=10, le=65536, description="Worker boot disk; GPU containers need 50 GB or more.")
    max_num_workers: int = Field(1, ge=1, le=1000, description="Upper bound for Dataflow autoscaling.")


class ContainerConfig(_Section):
    recipe: str | None = Field(None, description=(
        "Recipe in docker/ used to build the worker image. Empty: cpu with gpu.type none, vllm with "
        "inference.engine vllm, l4 otherwise."))
    image: str | None = Field(
        None,
        description=(
            "Worker image URI. Empty: REGION-docker.pkg.dev/PROJECT/REPOSITORY/RECIPE:TAG, the tag derived "
            "from the build context's content (gcp: built only when that tag is missing)."
        ),
    )
    repository: str = Field("gpuflow", description="gcp: the Artifact Registry Docker repository for the image.")
    build_timeout_s: int = Field(3600, ge=60, le=86400, description="gcp: Cloud Build timeout for the image.")
    flex_launcher_tag: str | None = Field(None, description=(
        "launch.mode flex_template: the tag of gcr.io/dataflow-templates-base/pythonXYZ-template-launcher-base "
        "whose launcher the image copies, from the table of cloud.google.com/dataflow/docs/reference/"
        "flex-templates-base-images (never latest: the image's tag is derived from its content). Empty: the "
        "pinned tag in catalog/images.yaml for python_version."))

    @field_validator("repository")
    @classmethod
    def _repository_id(cls, value: str) -> str:
        # Artifact Registry's repository names (cloud.google.com/artifact-registry/docs/repositories/create-repos):
        # lowercase letters, digits and hyphens, a letter first, a letter or digit last, at most 63.
        if not re.fullmatch(r"[a-z]([a-z0-9-]{0,61}[a-z0-9])?", value):
            raise ValueError("must be an Artifact Registry repository id: lowercase letters, digits and hyphens, a "
                             "letter first")
        return value


class ExportConfig(_Section):
    """Where the state_dict goes; gcp: the Vertex AI custom job that writes it (local: a subprocess)."""

    model_dir: str | None = Field(
        None,
        description=(
            "gs:// folder to export the model into and keep across runs (a run skips the export when the same "
            "model is there; cleanup leaves it). Empty: under the run's prefix, deleted by cleanup."
        ),
    )

    machine_type: str | None = Field(
        None, description="Vertex AI machine type. Empty: from the model size (e2-standard-4 up to e2-highmem-16)."
    )
    boot_disk_size_gb: int | None = Field(
        None, ge=100, le=65536, description="Boot disk of the export job. Empty: 100 GB, 150 GB for flan-ul2."
    )
    container_image: str = Field(
        # The export runs on CPU machines (e2), so Vertex AI's prebuilt PyTorch CPU training image; the
        # list of prebuilt training images: cloud.google.com/vertex-ai/docs/training/pre-built-containers
        "us-docker.pkg.dev/vertex-ai/training/pytorch-cpu.2-4.py310:latest",
        description="Vertex AI prebuilt PyTorch CPU training container the export script runs in (the export "
                    "machines are e2 CPU machines).",
    )
    pip_packages: list[str] = Field(
        default_factory=list,
        description="Installed in the export container after docker/locks/export.lock, before download_model.py "
                    "runs. Pin them (name==version): an open range resolves to whatever is newest on the day.",
    )
    timeout_s: float = Field(7200, gt=0, description="How long export_model waits for the Vertex AI job.")


    @field_validator("model_dir")
    @classmethod
    def _gcs_folder(cls, value: str | None) -> str | None:
        if not value:
            return None
        if not re.fullmatch(r"gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[^/]+)+/?", value):
            raise ValueError("must be a gs://BUCKET/folder URI, e.g. gs://my-models/flan-t5-large")
        return no_dot_segments(value).rstrip("/")


class LaunchConfig(_Section):
    mode: Literal["direct", "flex_template"] | None = Field(
        None,
        description=(
            "Empty: flex_template on gcp, direct on the local profile. flex_template: the worker image is also the "
            "Flex Template launcher, so the job is staged by the image's own Beam and Python (one image, one lock). "
            "direct: Airflow's own Beam stages the job (its Beam and Python must match the image's; preflight "
            "checks), for a launch environment that has the locked Beam."
        ),
    )


class DataflowConfig(_Section):
    """gcp: how Dataflow jobs are launched, watched and stopped."""

    service_account: str | None = Field(
        None, description="Worker service account email. Empty: the Compute Engine default service account."
    )
    experiments: list[str] = Field(
        default_factory=list, description="More Dataflow experiments; gpuflow adds use_runner_v2 and the sharing ones."
    )
    network: str | None = Field(None, description="VPC network of the workers. Empty: default.")
    subnetwork: str | None = Field(None, description="Subnetwork URL of the workers, e.g. regions/R/subnetworks/S.")
    use_public_ips: bool = Field(True, description=(
        "false: workers get no external IP (--no_use_public_ips), as an organization policy on external IPs "
        "requires; then dataflow.subnetwork must have Private Google Access."))
    start_timeout_s: float = Field(
        1800, gt=0, description="How long launch and verify_gpu wait for GPU workers to start (minutes, typically)."
    )
    poll_interval_s: float = Field(15, gt=0, description="Seconds between job state checks.")
    stop_action: Literal["cancel", "drain"] = Field(
        "cancel", description="cleanup: cancel (stop now) or drain (finish in-flight prompts first) the job."
    )
    stop_timeout_s: float = Field(900, gt=0, description="cleanup: how long to wait for the job to stop.")

    @field_validator("network", "subnetwork")
    @classmethod
    def _resource_path(cls, value: str | None) -> str | None:
        """A network's name, or a subnetwork's path or URL: they reach the gcloud lines preflight prints, so no
        shell syntax."""
        if value and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9/:._-]*", value):
            raise ValueError("must be a name, a regions/R/subnetworks/S path or its URL (letters, digits, '/', ':', "
                             "'.', '_', '-')")
        return value or None


class PubSubConfig(_Section):
    """Base names; each run prefixes them with its run-scoped prefix."""

    prompts_topic: str = Field("prompts", description="Topic the prompts are published to.")
    prompts_subscription: str = Field(
        "prompts-sub", description="Subscription the pipeline reads; created before launch so no prompt is lost."
    )
    responses_topic: str = Field("responses", description="Topic the answers go to, each with its prompt's id.")
    responses_subscription: str = Field("responses-sub", description="Subscription the smoke test reads answers from.")
    dead_letter_topic: str = Field("dead-letters", description="Topic for prompts that got no answer, with the reason.")
    dead_letter_subscription: str = Field("dead-letters-sub", description="Subscription on the dead-letter topic.")

    @field_validator("*")
    @classmethod
    def _pubsub_id(cls, value: str) -> str:
        longest = PUBSUB_PREFIX_MAX + len(value) + PUBSUB_SUFFIX_MAX
        if not PUBSUB_ID.fullmatch(value) or value.startswith("goog") or longest > 255:
            raise ValueError(
                f"must be a Pub/Sub id: a letter first, then letters, digits, '-', '_', '.', '~', '+' or '%', not "
                f"starting with 'goog', and at most {255 - PUBSUB_PREFIX_MAX - PUBSUB_SUFFIX_MAX} characters (gpuflow "
                "prefixes it with the run's or deployment's name; Pub/Sub allows 255 in all)")
        return value


class InferenceConfig(_Section):
    engine: Literal["transformers", "vllm"] = Field("transformers", description=(
        "transformers: gpuflow's GenerateHandler (batched generate). vllm: Beam's VLLMCompletionsModelHandler, a vLLM "
        "server on each worker (decoder-only models on a GPU, with container.recipe vllm)."))
    vllm_gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description=(
        "vllm: the share of the GPU's memory vLLM takes for the weights and its KV cache (its "
        "--gpu-memory-utilization)."))
    min_batch_size: int = Field(1, ge=1, description="RunInference's smallest batch.")
    max_batch_size: int = Field(16, ge=1, le=4096, description="RunInference's largest batch.")
    max_batch_duration_secs: float = Field(
        1.0,
        ge=0,
        le=600,
        description=(
            "How long a streaming batch may wait for more prompts across bundles. "
            "0 batches only within a bundle, which on Dataflow streaming is usually one prompt."
        ),
    )


    group_by_length: bool = Field(
        True,
        description=(
            "Batch prompts of similar token length together (Beam's length buckets), so batches pad little. "
            "Uses the cross-bundle batching path, so it needs max_batch_duration_secs."
        ),
    )


class SmokeTestConfig(_Section):
    num_prompts: int = Field(8, ge=1, le=10000, description="Prompts the smoke test publishes.")
    timeout_s: float = Field(300, gt=0, description="How long the smoke test waits for every answer.")
    gpu_usage: Literal["fail", "warn", "ignore"] = Field(
        "fail",
        description=(
            "gcp: after the answers, read the job's GPU utilisation from Cloud Monitoring over the smoke test's "
            "window; zero utilisation (the guide's 'no GPU usage') fails the task, or only warns."
        ),
    )
    gpu_usage_timeout_s: float = Field(
        300, gt=0, description="gcp: how long to wait for the GPU metrics to reach Cloud Monitoring (they lag)."
    )
    # Both from the Cloud Monitoring metrics list (docs.cloud.google.com/monitoring/api/metrics_gcp_d_h, section
    # dataflow): GAUGE, INT64, percent, on resource dataflow_job, metric label job_id.
    gpu_utilization_metric: str = Field(
        "dataflow.googleapis.com/job/gpu_utilization",
        description=(
            "Cloud Monitoring metric type of the job's GPU utilization: the percent of time one or more kernels "
            "was executing on the GPU."
        ),
    )
    gpu_memory_metric: str = Field(
        "dataflow.googleapis.com/job/gpu_memory_utilization",
        description=(
            "Cloud Monitoring metric type of the job's GPU memory utilization: the percent of time device memory "
            "was being read or written (not how full it is)."
        ),
    )


class LocalConfig(_Section):
    pubsub_emulator_host: str = Field("localhost:8085", description="host:port of the Pub/Sub emulator.")
    storage_emulator_host: str = Field("http://localhost:9023", description="URL of the GCS emulator.")
    runner: str = Field("BundleBasedDirectRunner", description="Beam runner for local pipelines.")
    state_dir: str = Field(
        "/tmp/gpuflow", description="Where local pipeline processes keep their pid files and logs."
    )
    pipeline_start_timeout_s: float = Field(300, gt=0, description="How long launch waits for the model to load.")


class DataprocConfig(_Section):
    """A Dataproc Serverless Spark batch with GPUs (the dataproc_gpu_batch DAG)."""

    runtime_version: str = Field("2.2", description="Dataproc Serverless runtime, e.g. 1.1 (XGBoost) or 2.2.")
    accelerator: Literal["l4", "a100-40", "a100-80"] = Field("l4", description="GPU type of every executor.")
    executor_instances: int = Field(2, ge=1, description="Executors; GPU batches need 2 or more.")
    executor_cores: int = Field(4, ge=1, description="Cores per executor: L4 4, 8, 12 or 16; A100 12.")
    executor_memory: int | None = Field(None, description="Executor memory in MB; set this or the overhead, not both.")
    executor_memory_overhead: int | None = Field(
        None, description="Executor memory overhead in MB; set this or executor_memory, not both."
    )
    disk_size: int = Field(375, ge=1, description="Executor disk in GB: exactly 375 for L4; A100 may differ.")
    main_python_file: str = Field(
        "spark_jobs/gpu_count_join.py", description="The PySpark file; relative paths are in the project."
    )
    args: list[str] = Field(default_factory=list, description="Arguments for the PySpark file.")
    pyspark: bool = Field(True, description="A PySpark workload (40% memory overhead by default, else 10%).")
    xgboost: bool = Field(False, description="The job needs XGBoost, which only runtime 1.x ships.")
    shuffle_manager: str | None = Field(
        "com.nvidia.spark.rapids.RapidsShuffleManager",
        description="spark.shuffle.manager; NVIDIA recommends the RAPIDS shuffle manager for GPU batches.",
    )
    properties: dict[str, str] = Field(
        default_factory=dict, description="More Spark properties; the tier and accelerator ones are gpuflow's."
    )
    local_threads: int = Field(2, ge=1, description="local profile: Spark local threads per executor.")
    poll_interval_s: float = Field(15, gt=0, description="gcp profile: seconds between batch state checks.")
    timeout_s: float = Field(
        7200, gt=0, description="How long the batch may run: the batch task's execution_timeout (less a margin)."
    )


class BatchConfig(_Section):
    """The llm_batch_inference DAG: each data interval's JSONL prompts in, answers and dead letters out.

    Paths are templates: ``{bucket}``, ``{ds}``, ``{ds_nodash}``, ``{ts_nodash}``, ``{data_interval_start}`` and
    ``{data_interval_end}`` (the run's Airflow date fields, as text) are filled per run by preflight. gs:// paths on
    both profiles; plain local paths on the local profile only."""

    schedule: str = Field("@daily", description="The DAG's schedule (cron or preset), read when the DAG is parsed.")
    catchup: bool = Field(False, description="Run the intervals missed since the DAG's start date (read when parsed).")
    input: str = Field("gs://{bucket}/prompts/{ds}/*.jsonl",
                       description='A glob of JSONL files, one {"id": ..., "prompt": ...} object a line.')
    output: str = Field("gs://{bucket}/answers/{ds}/", description=(
        "Folder of the date's answers (responses.jsonl and _SUCCESS). Replaced whole by a rerun, only once its job "
        "succeeded."))
    dead_letter_output: str = Field("gs://{bucket}/dead_letters/{ds}/", description=(
        "Folder of the date's dead letters (dead_letters.jsonl: each line's reason and the original line)."))
    missing_input: Literal["skip", "fail"] = Field("skip", description=(
        "When the input glob matches no file after input_wait_s: skip the run's other tasks, or fail the run."))
    input_wait_s: float = Field(3600, ge=0, description=(
        "How long to wait (deferred, no worker slot held) for the input to appear; 0 checks once."))
    input_poll_interval_s: float = Field(60, gt=0, description="Seconds between checks for the input.")
    job_timeout_s: float = Field(21600, gt=0, description="How long the batch job may run once started.")

    @field_validator("input", "output", "dead_letter_output")
    @classmethod
    def _template(cls, value: str) -> str:
        """Only plain ``{field}`` names: a format spec or conversion (``{ds:>999999999}``) could make a path of any
        size, so none is allowed. Which names are known is checked when a run fills them
        (``gpuflow.runs.batch_templates``)."""
        try:
            parsed = list(string.Formatter().parse(value))
        except ValueError as error:
            raise ValueError(f"is not a valid path template ({error}); write fields as {{ds}}") from None
        if any(spec or conversion or (name is not None and not name.isidentifier())
               for _, name, spec, conversion in parsed):
            raise ValueError("may name fields only as plain {name}, without a format or conversion (e.g. {ds})")
        return no_dot_segments(value)

    @field_validator("output", "dead_letter_output")
    @classmethod
    def _folder(cls, value: str) -> str:
        return value if value.endswith("/") else value + "/"


#: A deployment's name: it prefixes topic and Dataflow job names and is a label value.
DEPLOYMENT_NAME = re.compile(r"[a-z][a-z0-9-]{0,22}[a-z0-9]")


class DeploymentConfig(_Section):
    """llm_streaming_inference: ``ephemeral`` builds, proves and tears down (the tutorial's shape); ``persistent``
    leaves a serving deployment behind, and each later run rolls a new model version or job out to it."""

    mode: Literal["ephemeral", "persistent"] = Field("ephemeral", description=(
        "ephemeral: the run deletes everything it made. persistent: the deployment's topics, subscription, model "
        "folder and job keep serving after the run (stop it with the llm_streaming_teardown DAG)."))
    name: str | None = Field(None, description=(
        "The deployment's name (lowercase letters, digits, hyphens; up to 24). Empty: from the DAG id."))
    refresh_interval_s: float = Field(60, gt=0, description=(
        "How often the job looks for a new model version (RunInference's model refresh: WatchFilePattern's "
        "interval on Dataflow)."))
    rollout_timeout_s: float = Field(900, gt=0, description=(
        "How long the smoke test waits for answers from the new version before it rolls back."))
    transform_name_mapping: dict[str, str] = Field(default_factory=dict, description=(
        "gcp update in place: old transform name -> new, for transforms renamed since the running job started."))

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not DEPLOYMENT_NAME.fullmatch(value):
            raise ValueError("must be 2-24 lowercase letters, digits or hyphens, starting with a letter and not "
                             "ending with a hyphen (it prefixes topic and Dataflow job names)")
        return value




class RolloutConfig(_Section):
    """A lasting deployment's rollout gate: before traffic switches, the serving version and the candidate answer
    the same evaluation set, and the candidate is promoted only within these bounds (docs/deployment.md). Only the
    configuration file sets these: a run's conf cannot."""

    eval_set: str | None = Field(None, description=(
        "The evaluation set: a JSONL file of {\"id\", \"prompt\", optional \"reference\"} lines, as a gs:// URI "
        "in the bucket (the local profile: also a file under local.state_dir). Empty: no gate; the log says so."))
    score: Literal["exact", "contains", "rouge_l"] = Field("rouge_l", description=(
        "How an answer is scored against its reference: exact (the same text, spaces and case aside), contains "
        "(the reference within the answer), rouge_l (ROUGE-L F1, Google Research's rouge-score). A prompt without "
        "a reference scores the candidate's agreement with the serving version's answer, the same way."))
    max_score_drop: float = Field(0.05, ge=0, le=1, description=(
        "The candidate is promoted only if its mean score is at least the serving version's minus this."))
    max_latency_ratio: float = Field(1.5, ge=1, description=(
        "The candidate is promoted only if the median of its per-batch latency ratios (candidate/serving, the same "
        "batches, measured side by side) is at most this."))
    min_latency_pairs: int = Field(8, ge=1, description=(
        "The latency bound is read only from at least this many batches measured by both versions (after the "
        "warm-up ones); a small set runs again in rounds to reach it. Fewer: latency not checked, which refuses."))
    warmup_batches: int = Field(1, ge=0, description=(
        "The first batches each version runs, dropped from its latency (model loading, cold caches)."))
    max_rounds: int = Field(20, ge=1, le=1000, description=(
        "At most this many runs of the whole set (the same batches) to reach rollout.min_latency_pairs; scores "
        "use the first run's answers only."))

    @field_validator("eval_set")
    @classmethod
    def _jsonl(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.endswith(".jsonl"):
            raise ValueError("must name a .jsonl file (one JSON object per line: id, prompt, optional reference)")
        no_dot_segments(value)
        return value


class AllowedConfig(_Section):
    """What a run may choose beyond its knobs. Only the configuration file sets these (the deployment manager's, or
    the DAG author's): a run's conf cannot (docs/security.md)."""

    models: list[str] = Field(default_factory=list, description=(
        "Models a run may pick as model.name, besides the file's own model.name and gpuflow's offline demo models: "
        "hub names or local directories."))
    images: list[str] = Field(default_factory=list, description=(
        "Prefixes of worker images a run may pick as container.image (e.g. us-central1-docker.pkg.dev/P/gpuflow/). "
        "Empty: a run builds the image from the recipe and picks none."))
    gcs_prefixes: list[str] = Field(default_factory=list, description=(
        "gs:// folders, besides gs://BUCKET/ of bucket, under which a run may point batch.* and export.model_dir."))

    @field_validator("gcs_prefixes")
    @classmethod
    def _gcs_folders(cls, value: list[str]) -> list[str]:
        for prefix in value:
            if not re.fullmatch(r"gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/[^/]+)*/?", prefix):
                raise ValueError(f"{prefix!r} must be a gs://BUCKET/ or gs://BUCKET/folder/ URI")
            no_dot_segments(prefix)
        return [prefix if prefix.endswith("/") else prefix + "/" for prefix in value]


class LimitsConfig(_Section):
    """What one run may cost at most. Only the configuration file sets these (a run's conf cannot: docs/security.md).
    A limit left empty leaves the matching knobs where the file puts them: a run may lower them, not raise them."""

    max_gpus: int | None = Field(None, ge=1, description=(
        "The most GPUs one job may hold at its peak: Dataflow's max_num_workers x gpu.count, or Dataproc's "
        "executors (one GPU each). Empty: a run may not raise worker.max_num_workers or gpu.count above the file's."))
    gpu_types: list[str] = Field(default_factory=list, description=(
        "GPU types (gpu.type) and Dataproc accelerators a job may use. Empty: a run keeps the file's GPU type "
        "(or picks gpu.type none)."))
    regions: list[str] = Field(default_factory=list, description=(
        "Regions a run may pick (region). Empty: a run keeps the file's region. (gpu.fallbacks' regions are the "
        "file's own.)"))
    max_job_hours: float | None = Field(None, gt=0, description=(
        "The most hours a job may run: batch.job_timeout_s and dataproc.timeout_s must fit; a lasting deployment, "
        "which runs until it is torn down, is refused. Empty: a run may not raise a timeout above the file's."))
    lasting_deployments: bool | None = Field(None, description=(
        "Whether a run may start a lasting deployment (deployment.mode persistent). Empty: only when the file's "
        "own mode is persistent."))
    max_dataproc_executors: int | None = Field(None, ge=1, description=(
        "The most Dataproc executors a batch may ask for. Empty: a run may not raise dataproc.executor_instances "
        "above the file's."))
    min_poll_interval_s: float = Field(1, gt=0, description=(
        "The shortest poll interval any setting may have (dataflow.poll_interval_s, dataproc.poll_interval_s, "
        "batch.input_poll_interval_s, deployment.refresh_interval_s): a shared triggerer polls Google at most "
        "this often per job."))
    max_usd_per_hour: float | None = Field(None, gt=0, description=(
        "The most a run's main job may cost per hour at its peak, in USD at on-demand list prices "
        "(catalog/prices.yaml). A run whose figure is higher, or that the catalog cannot price, is refused. "
        "Empty: no bound, and a run keeps the file's machine types."))

    @field_validator("regions")
    @classmethod
    def _regions(cls, value: list[str]) -> list[str]:
        for region in value:
            _matches(REGION, "region", region)
        return value


class JanitorConfig(_Section):
    """gpuflow_janitor: deletes what no running DAG run and no recorded deployment owns."""

    dry_run: bool = Field(False, description="List what would be deleted, and delete nothing.")


#: Fields whose shape a regular expression checks: field -> (pattern, what the message says).
_FIELD_PATTERNS = {
    "project": (
        r"[a-z][a-z0-9-]{4,28}[a-z0-9]",
        "must be a Google Cloud project id: 6-30 characters, lowercase letters, digits and hyphens, "
        "starting with a letter (for example 'my-project-123')",
    ),
    "python_version": (r"3\.\d{1,2}", "must be a Python minor version such as '3.11' (no patch number)"),
    "beam_version": (r"\d+\.\d+\.\d+", "must be a full Beam release such as '2.77.0'"),
}


class GpuflowConfig(_Section):
    profile: Literal["local", "gcp"] = Field("local", description="local: emulators and DirectRunner. gcp: Google Cloud.")
    project: str = Field("gpuflow-local", description="Google Cloud project id.")
    region: str = Field("us-central1", description="Region for Dataflow, Vertex AI and Pub/Sub.")
    bucket: str | None = Field(
        None,
        description=(
            "GCS bucket for the model and staging. Empty: each run creates its own bucket and deletes it "
            "afterwards. Given: the run uses a run-scoped prefix in it and deletes only that prefix."
        ),
    )
    gcp_conn_id: str = Field("google_cloud_default", description="Airflow connection for Google Cloud hooks.")
    impersonation_chain: list[str] = Field(default_factory=list, description=(
        "gcp: service accounts every Google call, hook and job launch impersonates, the last the one that acts "
        "(the provider's impersonation_chain). How a team on a shared Composer environment acts as its own account. "
        "Set only by the configuration file. Empty: the connection's (its extra's impersonation_chain, if any)."))
    beam_version: str = Field("2.77.0", description="Beam version of the worker container.")
    python_version: str = Field("3.11", description="Python minor version of the worker container.")
    require_gpu: bool = Field(False, description="Fail when the workers see no GPU instead of running on CPU.")
    source_file: str | None = Field(None, description=(
        "Set by gpuflow, never by a file or a run: the configuration file this configuration was read from. A "
        "lasting deployment belongs to it."))
    dataflow_service_options: list[str] = Field(
        default_factory=list,
        description=(
            "Extra Dataflow service options. A hand-written worker_accelerator=... is checked for token order "
            "and must agree with gpu.*; gpuflow builds that option itself otherwise."
        ),
    )
    model: ModelConfig = ModelConfig()
    gpu: GpuConfig = GpuConfig()
    worker: WorkerConfig = WorkerConfig()
    container: ContainerConfig = ContainerConfig()
    export: ExportConfig = ExportConfig()
    dataflow: DataflowConfig = DataflowConfig()
    launch: LaunchConfig = LaunchConfig()
    pubsub: PubSubConfig = PubSubConfig()
    inference: InferenceConfig = InferenceConfig()
    smoke_test: SmokeTestConfig = SmokeTestConfig()
    local: LocalConfig = LocalConfig()
    batch: BatchConfig = BatchConfig()
    deployment: DeploymentConfig = DeploymentConfig()
    rollout: RolloutConfig = RolloutConfig()
    janitor: JanitorConfig = JanitorConfig()
    allowed: AllowedConfig = AllowedConfig()
    limits: LimitsConfig = LimitsConfig()
    dataproc: DataprocConfig | None = Field(None, description="A Dataproc Serverless GPU batch (optional).")

    @property
    def traits(self) -> ProfileTraits:
        """What this profile's runner can and cannot do (``gpuflow.configuration.profiles``)."""
        return PROFILES[self.profile]

    @property
    def site(self) -> str:
        """The site whose file this configuration was read from (gpuflow.sites): its file's stem. Empty for one read
        from no file, or from a file whose name cannot name a site (configs/gcp.example.yaml): its resources carry
        no site label, and only a janitor of no site judges them."""
        # The pattern, not gpuflow.sites.site_name: a call there would add sites.py to every task's files
        # (tests/task_trace.py), for a check this line makes without raising.
        stem = PurePath(self.source_file).stem if self.source_file else ""
        return stem if SITE_NAME.fullmatch(stem) else ""

    @property
    def launch_mode(self) -> Literal["direct", "flex_template"]:
        """launch.mode, or the profile's: on gcp the worker image launches its own job, so Composer's Beam (which
        moves with its builds) never stages it; locally the pipeline runs in this environment anyway."""
        if self.launch.mode:
            return self.launch.mode
        return "flex_template" if self.traits.dataflow_workers else "direct"

    @property
    def uses_gpu(self) -> bool:
        """False with gpu.type none: CPU workers, no accelerator, no GPU quota, no GPU check."""
        return self.gpu.type != NO_GPU

    @property
    def recipe(self) -> str:
        """container.recipe, or the recipe the run needs: no CUDA library on CPU workers, vLLM for its engine."""
        if self.container.recipe:
            return self.container.recipe
        if not self.uses_gpu:
            return "cpu"
        return "vllm" if self.inference.engine == "vllm" else "l4"

    @field_validator(*_FIELD_PATTERNS)
    @classmethod
    def _matches_pattern(cls, value: str, info: ValidationInfo) -> str:
        pattern, message = _FIELD_PATTERNS[str(info.field_name)]
        if not re.fullmatch(pattern, value):
            raise ValueError(message)
        return value

    @field_validator("impersonation_chain")
    @classmethod
    def _service_accounts(cls, chain: list[str]) -> list[str]:
        # Only a service account can be impersonated (cloud.google.com/iam/docs/service-account-impersonation)
        wrong = [account for account in chain if not re.fullmatch(r"[a-z0-9._-]+@[a-z0-9.-]+\.gserviceaccount\.com",
                                                                   account)]
        if wrong:
            raise ValueError(f"{wrong} are not service account emails (NAME@PROJECT.iam.gserviceaccount.com): only a "
                             "service account can be impersonated")
        return chain

    def hook_identity(self, conn_id: str | None = None) -> dict[str, Any]:
        """The provider hooks' identity arguments: ``gcp_conn_id`` (``conn_id``: the platform's, which on the local
        profile is the emulators'; else the file's) and, on gcp, the file's ``impersonation_chain`` (the emulators
        take no identity)."""
        chain = [] if self.traits.storage_emulator else self.impersonation_chain
        return {"gcp_conn_id": conn_id or self.gcp_conn_id, "impersonation_chain": chain or None}

    @field_validator("bucket")
    @classmethod
    def _bucket_name(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        return _bucket_rule(value.removeprefix("gs://").rstrip("/"))

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        return _matches(REGION, "region", value) or value
