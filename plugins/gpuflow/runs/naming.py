"""Run-scoped and deployment-scoped resource names.

Every name derives from the DAG id and run id only, so a retried task finds the
resources an earlier try created, and two runs never share a topic or bucket.
A persistent deployment's serving resources (``deployment.mode: persistent``) derive from its name instead:
they outlive the run, and the next run finds them. Run names start ``gf-``, deployment names ``gfd-``: the janitor
knows gpuflow's resources by these prefixes (and the labels of the same names).
"""

from __future__ import annotations

import hashlib
import re

from pydantic import BaseModel

from gpuflow.configuration.model import GpuflowConfig

#: Google's label requirements (cloud.google.com/resource-manager/docs/labels-overview#requirements): a key of
#: 1-63 lowercase letters, digits, '_' or '-', starting with a letter; a value of 0-63 of the same (gpuflow writes
#: no international characters, which the page also allows).
LABEL_KEY = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE = re.compile(r"[a-z0-9_-]{0,63}")
#: gpuflow's own prefix in a bucket (run folders, deployments' records and model versions, leases): no batch output
#: may lie under it, since publishing replaces files there.
GPUFLOW_PREFIX = "gpuflow/"


def run_prefix(dag_id: str, run_id: str) -> str:
    """A short prefix that is valid in bucket, topic and Dataflow job names."""
    digest = hashlib.sha256(f"{dag_id}/{run_id}".encode()).hexdigest()[:10]
    return f"gf-{digest}"


class ResourceNames(BaseModel):
    prefix: str
    bucket: str
    bucket_is_run_scoped: bool
    object_prefix: str
    prompts_topic: str
    prompts_subscription: str
    responses_topic: str
    responses_subscription: str
    dead_letter_topic: str
    dead_letter_subscription: str
    job_name: str
    model_dir_uri: str  # the exported model: under the run's prefix, or export.model_dir (kept across runs)
    deployment: str | None = None  # persistent mode: the deployment whose topics and job the run serves on
    job_prefix: str = ""  # what the run's streaming job name starts with (the run prefix, or the deployment's)
    model_version: str = ""  # the id each answer of the model this run exported carries: <model name>@<run prefix>
    site: str = ""  # the site whose DAGs made the run (GpuflowConfig.site): a janitor judges its own site's only

    @property
    def run_topics(self) -> list[str]:
        """The topics the run creates and deletes: all of them, or none when a deployment owns them."""
        return [] if self.deployment else self.topics

    @property
    def run_subscriptions(self) -> dict[str, str]:
        """The subscriptions the run creates and deletes (a deployment's run: its smoke test's own two)."""
        if not self.deployment:
            return self.subscriptions
        return {self.responses_subscription: self.responses_topic,
                self.dead_letter_subscription: self.dead_letter_topic}

    @property
    def labels(self) -> dict[str, str]:
        """The labels by which the janitor knows a job, topic or subscription: the run that made it, its
        deployment if any (the names carry the same prefixes) and its site. Each is checked to Google's label
        rule."""
        labels = {"gpuflow-run": self.prefix, **({DEPLOYMENT_LABEL: self.deployment} if self.deployment else {}),
                  **({SITE_LABEL: self.site} if self.site else {})}
        bad = {key: value for key, value in labels.items()
               if not (LABEL_KEY.fullmatch(key) and LABEL_VALUE.fullmatch(value))}
        if bad:
            raise ValueError(f"labels {bad} break Google's label rule (keys {LABEL_KEY.pattern}, values "
                             f"{LABEL_VALUE.pattern})")
        return labels

    @property
    def owns_job_subscription(self) -> bool:
        """A deployment's run on the local profile reads prompts through a subscription of its own (its name ends
        with the run's id): the run deletes it unless its job took over."""
        return bool(self.deployment) and self.prompts_subscription.endswith("-" + self.prefix.removeprefix("gf-"))

    @property
    def topics(self) -> list[str]:
        return [self.prompts_topic, self.responses_topic, self.dead_letter_topic]

    @property
    def subscriptions(self) -> dict[str, str]:
        """subscription -> the topic it reads."""
        return {
            self.prompts_subscription: self.prompts_topic,
            self.responses_subscription: self.responses_topic,
            self.dead_letter_subscription: self.dead_letter_topic,
        }

    @property
    def serving(self) -> str:
        """The deployment a persistent run serves on (a run without one is a caller's mistake)."""
        if self.deployment is None:
            raise ValueError(f"run {self.prefix} serves no deployment: deployment.mode is not persistent")
        return self.deployment

    def gcs_uri(self, *parts: str) -> str:
        return "/".join([f"gs://{self.bucket}", self.object_prefix, *parts])

    @property
    def state_dict_uri(self) -> str:
        return f"{self.model_dir_uri}/state_dict.pth"


#: The deployment of llm_streaming_inference when deployment.name is empty (its DAG id, as a name).
DEFAULT_DEPLOYMENT = "llm-streaming-inference"


def deployment_name(config: GpuflowConfig) -> str:
    return config.deployment.name or DEFAULT_DEPLOYMENT


def deployment_prefix(name: str) -> str:
    return f"gfd-{name}"


#: The label that names the deployment a job, topic or subscription serves (``ResourceNames.labels``).
DEPLOYMENT_LABEL = "gpuflow-deployment"
#: The label that names the site whose DAGs made a resource: several sites may share a project, and each one's
#: janitor reads its own records only, so it judges only what its own site made.
SITE_LABEL = "gpuflow-site"


def owned_by_deployment(config: GpuflowConfig, name: str, kind: str, resource: str) -> bool:
    """Whether ``resource`` (a topic or a subscription) bears one of deployment ``name``'s own names: its three
    topics, and its job's prompts subscription (on the local profile, each job's own: that name, a hyphen and the
    run's 10 hex digits)."""
    serving, pubsub = deployment_prefix(name), config.pubsub
    if kind == "topics":
        return resource in {f"{serving}-{pubsub.prompts_topic}", f"{serving}-{pubsub.responses_topic}",
                            f"{serving}-{pubsub.dead_letter_topic}"}
    subscription = f"{serving}-{pubsub.prompts_subscription}"
    return resource == subscription or bool(re.fullmatch(re.escape(subscription) + "-[0-9a-f]{10}", resource))


#: Where in the bucket every deployment has its folder.
DEPLOYMENTS_FOLDER = f"{GPUFLOW_PREFIX}deployments"


def deployment_folder(config: GpuflowConfig, name: str | None = None) -> str:
    """gs:// folder of a deployment's model versions, pointers and record."""
    return f"gs://{config.bucket}/{DEPLOYMENTS_FOLDER}/{name or deployment_name(config)}"


def pointer_folder(config: GpuflowConfig, name: str) -> str:
    """The folder of model version pointers that a deployment's job watches (RunInference's model refresh)."""
    return f"{deployment_folder(config, name)}/live"


def resource_names(config: GpuflowConfig, prefix: str) -> ResourceNames:
    names = _run_names(config, prefix)
    if config.deployment.mode != "persistent":
        return names
    name = deployment_name(config)
    serving, pubsub = deployment_prefix(name), config.pubsub
    # The local DirectRunner acknowledges prompts as it pulls them and cannot drain, so on the local profile each
    # job reads a subscription of its own on the deployment's prompts topic (a replacement overlaps the old job
    # on its own subscription instead: a prompt may be answered twice, never lost). Dataflow drains: one
    # subscription serves every job of the deployment, as the rollout page describes.
    job_subscription = f"{serving}-{pubsub.prompts_subscription}"
    if not config.traits.drains:
        job_subscription += "-" + prefix.removeprefix("gf-")
    return names.model_copy(update={
        "deployment": name,
        "prompts_topic": f"{serving}-{pubsub.prompts_topic}",
        "prompts_subscription": job_subscription,
        "responses_topic": f"{serving}-{pubsub.responses_topic}",
        "dead_letter_topic": f"{serving}-{pubsub.dead_letter_topic}",
        "job_prefix": f"{serving}-{prefix.removeprefix('gf-')}",
        "job_name": f"{serving}-{prefix.removeprefix('gf-')}-llm-inference",
        "model_dir_uri": f"{deployment_folder(config, name)}/versions/{prefix}",
    })


def _run_names(config: GpuflowConfig, prefix: str) -> ResourceNames:
    pubsub = config.pubsub
    if config.bucket:
        bucket, run_scoped = config.bucket, False
    else:
        bucket, run_scoped = f"{config.project}-{prefix}"[:63].rstrip("-"), True
    return ResourceNames(
        prefix=prefix,
        bucket=bucket,
        bucket_is_run_scoped=run_scoped,
        object_prefix=f"{GPUFLOW_PREFIX}{prefix}",
        prompts_topic=f"{prefix}-{pubsub.prompts_topic}",
        prompts_subscription=f"{prefix}-{pubsub.prompts_subscription}",
        responses_topic=f"{prefix}-{pubsub.responses_topic}",
        responses_subscription=f"{prefix}-{pubsub.responses_subscription}",
        dead_letter_topic=f"{prefix}-{pubsub.dead_letter_topic}",
        dead_letter_subscription=f"{prefix}-{pubsub.dead_letter_subscription}",
        job_name=f"{prefix}-llm-inference",
        model_dir_uri=config.export.model_dir or f"gs://{bucket}/{GPUFLOW_PREFIX}{prefix}/model",
        job_prefix=prefix,
        model_version=f"{config.model.name.rstrip('/').rsplit('/', 1)[-1]}@{prefix}",
        site=config.site,
    )
