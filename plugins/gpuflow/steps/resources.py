"""setup and cleanup of the run's bucket, topics and subscriptions, through the provider's hooks.

The hooks work unchanged on the emulators (local profile) and on Google Cloud (gcp profile).
"""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.config import GpuflowConfig
from gpuflow.naming import ResourceNames

log = logging.getLogger(__name__)


def _hooks(conn_id: str):
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    return PubSubHook(gcp_conn_id=conn_id), GCSHook(gcp_conn_id=conn_id)


def _bucket_readable(gcs, bucket: str) -> bool:
    from google.api_core.exceptions import Forbidden, NotFound

    try:
        gcs.get_conn().bucket(bucket).reload()
        return True
    except (Forbidden, NotFound):
        return False


def ensure_bucket(gcs, config: GpuflowConfig, names: ResourceNames) -> bool:
    """Create the bucket if missing; True if this call created it. A 409 counts only if we can read it."""
    from google.api_core.exceptions import Conflict

    if _bucket_readable(gcs, names.bucket):
        log.info("bucket gs://%s exists; reusing it", names.bucket)
        return False
    try:
        gcs.create_bucket(bucket_name=names.bucket, project_id=config.project, location=config.region.upper(),
                          storage_class="STANDARD")
        log.info("created bucket gs://%s", names.bucket)
        return True
    except Conflict:
        if _bucket_readable(gcs, names.bucket):
            return False
        raise RuntimeError(
            f"bucket name {names.bucket} is taken by another project. Fix: set bucket to a name you own."
        ) from None


def create_resources(config: GpuflowConfig, names: ResourceNames, conn_id: str, pubsub: bool = True) -> dict[str, Any]:
    """Idempotent: existing resources with the run's names are reused. On failure, removes what it made.
    ``pubsub=False`` (a batch run): the bucket only."""
    pubsub_hook, gcs = _hooks(conn_id)
    topics = names.topics if pubsub else []
    try:
        bucket_created = ensure_bucket(gcs, config, names)
        for topic in topics:
            pubsub_hook.create_topic(topic=topic, project_id=config.project)
        for subscription, topic in (names.subscriptions if pubsub else {}).items():
            # Created before the pipeline starts, so no prompt published early is lost.
            pubsub_hook.create_subscription(topic=topic, subscription=subscription, project_id=config.project,
                                       ack_deadline_secs=60)
    except Exception:
        log.exception("setup failed; removing what it created")
        delete_resources(config, names, conn_id)
        raise
    subscriptions = list(names.subscriptions) if pubsub else []
    log.info("setup done: bucket %s, topics %s, subscriptions %s", names.bucket, topics, subscriptions)
    return {"bucket": names.bucket, "bucket_created": bucket_created, "topics": topics,
            "subscriptions": subscriptions}


def delete_resources(config: GpuflowConfig, names: ResourceNames, conn_id: str, pubsub: bool = True) -> dict[str, Any]:
    """Delete everything the run's names point at; what is already gone is fine. ``pubsub=False`` (a batch run,
    whose setup made none): the bucket or prefix only."""
    pubsub_hook, gcs = _hooks(conn_id)
    subscriptions, topics = (list(names.subscriptions), names.topics) if pubsub else ([], [])
    problems: list[str] = []
    for subscription in subscriptions:
        try:
            pubsub_hook.delete_subscription(subscription=subscription, project_id=config.project,
                                            fail_if_not_exists=False)
        except Exception as error:  # keep going: one stuck resource must not leak the others
            problems.append(f"subscription {subscription}: {error}")
    for topic in topics:
        try:
            pubsub_hook.delete_topic(topic=topic, project_id=config.project, fail_if_not_exists=False)
        except Exception as error:
            problems.append(f"topic {topic}: {error}")
    try:
        if names.bucket_is_run_scoped:
            if _bucket_readable(gcs, names.bucket):
                for blob_name in gcs.list(names.bucket):
                    gcs.delete(names.bucket, blob_name)
                gcs.delete_bucket(bucket_name=names.bucket, force=True)
        elif _bucket_readable(gcs, names.bucket):
            for blob_name in gcs.list(names.bucket, prefix=names.object_prefix + "/"):
                gcs.delete(names.bucket, blob_name)
    except Exception as error:
        problems.append(f"bucket {names.bucket}: {error}")
    if problems:
        raise RuntimeError("cleanup could not delete: " + "; ".join(problems))
    log.info("deleted the run's subscriptions, topics and %s", "bucket" if names.bucket_is_run_scoped else "prefix")
    return {"deleted_topics": topics, "deleted_subscriptions": subscriptions,
            "deleted_bucket": names.bucket if names.bucket_is_run_scoped else None}


def list_run_resources(config: GpuflowConfig, names: ResourceNames, conn_id: str) -> dict[str, list[str]]:
    """What still exists of the run (topics, subscriptions, bucket); used by tests and cleanup checks."""
    pubsub, gcs = _hooks(conn_id)
    project_path = f"projects/{config.project}"
    topics = [t.name.rsplit("/", 1)[-1] for t in pubsub.get_conn().list_topics(request={"project": project_path})]
    subscriptions = [
        s.name.rsplit("/", 1)[-1]
        for s in pubsub.subscriber_client.list_subscriptions(request={"project": project_path})
    ]
    return {
        "topics": [t for t in topics if t.startswith(names.prefix)],
        "subscriptions": [s for s in subscriptions if s.startswith(names.prefix)],
        "buckets": [names.bucket] if names.bucket_is_run_scoped and _bucket_readable(gcs, names.bucket) else [],
    }
