"""Run-scoped resource names.

Every name derives from the DAG id and run id only, so a retried task finds the
resources an earlier try created, and two runs never share a topic or bucket.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel

from gpuflow.config import GpuflowConfig


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

    def gcs_uri(self, *parts: str) -> str:
        return "/".join([f"gs://{self.bucket}", self.object_prefix, *parts])

    @property
    def state_dict_uri(self) -> str:
        return f"{self.model_dir_uri}/state_dict.pth"


def resource_names(config: GpuflowConfig, prefix: str) -> ResourceNames:
    pubsub = config.pubsub
    if config.bucket:
        bucket, run_scoped = config.bucket, False
    else:
        bucket, run_scoped = f"{config.project}-{prefix}"[:63].rstrip("-"), True
    return ResourceNames(
        prefix=prefix,
        bucket=bucket,
        bucket_is_run_scoped=run_scoped,
        object_prefix=f"gpuflow/{prefix}",
        prompts_topic=f"{prefix}-{pubsub.prompts_topic}",
        prompts_subscription=f"{prefix}-{pubsub.prompts_subscription}",
        responses_topic=f"{prefix}-{pubsub.responses_topic}",
        responses_subscription=f"{prefix}-{pubsub.responses_subscription}",
        dead_letter_topic=f"{prefix}-{pubsub.dead_letter_topic}",
        dead_letter_subscription=f"{prefix}-{pubsub.dead_letter_subscription}",
        job_name=f"{prefix}-llm-inference",
        model_dir_uri=config.export.model_dir or f"gs://{bucket}/gpuflow/{prefix}/model",
    )
