"""setup and cleanup of the run's bucket, topics and subscriptions, through the provider's hooks.

The hooks work unchanged on the emulators (local profile) and on Google Cloud (gcp profile).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.gcs_uris import split_gcs_uri
from gpuflow.runs.naming import SITE_LABEL, ResourceNames, deployment_prefix

if TYPE_CHECKING:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

log = logging.getLogger(__name__)


#: The prompts subscription's ack deadline (seconds): Dataflow's reader acknowledges what it has taken in.
PROMPTS_ACK_DEADLINE_S = 60
#: The answers' and dead letters' subscriptions' ack deadline: Pub/Sub's minimum, 10 s ("The minimum custom deadline
#: you can specify is 10 seconds", Subscription.ack_deadline_seconds in google-cloud-pubsub's pubsub_v1 types), after
#: which "Pub/Sub waits for the subscriber to acknowledge receipt before resending the message".
ANSWERS_ACK_DEADLINE_S = 10


def _hooks(config: GpuflowConfig, conn_id: str) -> tuple[PubSubHook, GCSHook]:
    from airflow.providers.google.cloud.hooks.gcs import GCSHook
    from airflow.providers.google.cloud.hooks.pubsub import PubSubHook

    return PubSubHook(**config.hook_identity(conn_id)), GCSHook(**config.hook_identity(conn_id))


def _bucket_readable(gcs: GCSHook, bucket: str) -> bool:
    from google.api_core.exceptions import Forbidden, NotFound

    try:
        gcs.get_conn().bucket(bucket).reload()
        return True
    except (Forbidden, NotFound):
        return False


def _project_number(config: GpuflowConfig, conn_id: str) -> str | None:
    """The configured project's number (Resource Manager), on gcp; None on the local profile's emulator, which
    has no projects to tell apart."""
    if config.traits.storage_emulator:
        return None
    from gpuflow.platform.gcp_clients import GcpClients

    project = GcpClients(conn_id, config.impersonation_chain or None).projects().get_project(request={"name": f"projects/{config.project}"})
    return str(project.name).split("/", 1)[1]


def check_run_bucket(bucket: Any, config: GpuflowConfig, names: ResourceNames, conn_id: str) -> None:
    """A run-scoped bucket that already exists is this run's only when its ``gpuflow-run`` label is this run's and
    (gcp) its project number is the configured project's: its name is derived from the DAG and run ids, which a
    scheduled run makes known in advance, so anyone could have made it first. Refused before anything is written."""
    labels = dict(bucket.labels or {})
    problems = []
    if labels.get("gpuflow-run") != names.prefix:
        problems.append(f"its gpuflow-run label is {labels.get('gpuflow-run')!r}, not this run's {names.prefix!r}")
    expected = _project_number(config, conn_id)
    if expected is not None and str(bucket.project_number) != expected:
        problems.append(f"it belongs to project number {bucket.project_number}, not {config.project} ({expected})")
    if problems:
        raise RuntimeError(
            f"bucket gs://{names.bucket} exists but is not this run's: {'; '.join(problems)}. Nothing was written "
            "into it. Fix: set bucket to a bucket your project owns (the run then uses a prefix of its own in it), "
            "or delete that bucket if it is yours and left over.")


def ensure_bucket(gcs: GCSHook, config: GpuflowConfig, names: ResourceNames, conn_id: str) -> bool:
    """Create the bucket if missing; True if this call created it. A 409 counts only if we can read it. A
    run-scoped bucket that exists must be this run's own (``check_run_bucket``); a configured bucket is the team's."""
    from google.api_core.exceptions import Conflict

    if _bucket_readable(gcs, names.bucket):
        if names.bucket_is_run_scoped:
            check_run_bucket(gcs.get_conn().get_bucket(names.bucket), config, names, conn_id)
        log.info("bucket gs://%s exists; reusing it", names.bucket)
        return False
    try:
        gcs.create_bucket(bucket_name=names.bucket, project_id=config.project, location=config.region.upper(),
                          storage_class="STANDARD", labels=names.labels)
        if config.traits.storage_emulator:
            # gcp-storage-emulator keeps only a new bucket's name (handlers/buckets.py, create_bucket) and takes
            # labels in a PATCH: set them so, as Cloud Storage keeps them from the insert.
            bucket = gcs.get_conn().bucket(names.bucket)
            bucket.labels = names.labels
            bucket.patch()
        log.info("created bucket gs://%s", names.bucket)
        return True
    except Conflict:
        if _bucket_readable(gcs, names.bucket):
            if names.bucket_is_run_scoped:
                check_run_bucket(gcs.get_conn().get_bucket(names.bucket), config, names, conn_id)
            return False
        raise RuntimeError(
            f"bucket name {names.bucket} is taken by another project. Fix: set bucket to a name you own."
        ) from None


def check_deployment_topics(config: GpuflowConfig, names: ResourceNames, conn_id: str) -> None:
    """A deployment's topics are named after the deployment alone, and a run reuses them. Where they exist labelled
    with another site (``gpuflow-site``: sites may share a project), they are another team's deployment's, and its
    prompts would reach this site's job: refused before anything is made. (Topics made before gpuflow labelled
    sites carry no site label, and are reused.)"""
    existing = list_labeled(config, conn_id, deployment_prefix(names.serving) + "-")["topics"]
    others = {topic: labels[SITE_LABEL] for topic, labels in existing.items()
              if topic in names.topics and labels.get(SITE_LABEL, names.site) != names.site}
    if others:
        raise RuntimeError(
            f"deployment {names.deployment}'s topics exist in project {config.project}, made by another site's DAGs "
            f"({', '.join(f'{topic}: site {site}' for topic, site in sorted(others.items()))}); this run's site is "
            f"{names.site or '(none)'}. Nothing was created. Fix: give this site's deployment a name of its own "
            "(deployment.name), or use a project of the site's own.")


def create_resources(config: GpuflowConfig, names: ResourceNames, conn_id: str, pubsub: bool = True,
                     job_subscription: bool = True, lease: tuple[str, str] | None = None) -> dict[str, Any]:
    """Idempotent: existing resources with the run's names are reused. On failure, removes what the run owns.

    ``pubsub=False`` (a batch run): the bucket only. A deployment's run (``names.deployment``) creates the
    deployment's topics if missing, its smoke test's own subscriptions, and the job's prompts subscription when it
    starts a job (``job_subscription``). ``lease``: (dag_id, run_id), written beside the run's objects first, so
    the janitor can tell whose the rest is."""
    from gpuflow.platform.records import Records

    pubsub_hook, gcs = _hooks(config, conn_id)
    topics = names.topics if pubsub else []
    subscriptions = dict(names.run_subscriptions) if pubsub else {}
    if pubsub and job_subscription:
        subscriptions[names.prompts_subscription] = names.prompts_topic
    if pubsub and names.deployment:
        check_deployment_topics(config, names, conn_id)
    bucket_created = ensure_bucket(gcs, config, names, conn_id)  # refused: nothing made, nothing to remove
    try:
        if lease:
            Records(config, conn_id).write_lease(names, *lease)
        for topic in topics:
            pubsub_hook.create_topic(topic=topic, project_id=config.project, labels=names.labels)
        for subscription, topic in subscriptions.items():
            # Created before the pipeline starts, so no prompt published early is lost. The smoke test's own
            # subscriptions get the shortest ack deadline: what a trigger pulled but its task had not kept comes
            # back that soon after a triggerer restart (gpuflow.triggers.answers).
            deadline = PROMPTS_ACK_DEADLINE_S if subscription == names.prompts_subscription else ANSWERS_ACK_DEADLINE_S
            pubsub_hook.create_subscription(topic=topic, subscription=subscription, project_id=config.project,
                                            ack_deadline_secs=deadline, labels=names.labels)
    except Exception:
        log.exception("setup failed; removing what it created")
        delete_resources(config, names, conn_id, pubsub)
        raise
    log.info("setup done: bucket %s, topics %s, subscriptions %s", names.bucket, topics, list(subscriptions))
    return {"bucket": names.bucket, "bucket_created": bucket_created, "topics": topics,
            "subscriptions": list(subscriptions), "deployment": names.deployment}


def delete_resources(config: GpuflowConfig, names: ResourceNames, conn_id: str, pubsub: bool = True,
                     extra_subscriptions: tuple[str, ...] = ()) -> dict[str, Any]:
    """Delete everything the run owns; what is already gone is fine. ``pubsub=False`` (a batch run, whose setup
    made none): the bucket or prefix only. A deployment's run owns its smoke test's subscriptions and its objects,
    never the deployment's topics (``extra_subscriptions``: a job subscription that never took over)."""
    subscriptions, topics = ([*names.run_subscriptions, *extra_subscriptions], names.run_topics) if pubsub \
        else ([], [])
    problems = [*delete_subscriptions(config, conn_id, subscriptions, raise_errors=False),
                *delete_topics(config, conn_id, topics, raise_errors=False)]
    try:
        if names.bucket_is_run_scoped:
            delete_run_bucket(config, names, conn_id)
        else:
            delete_objects(config, conn_id, names.gcs_uri() + "/")
    except Exception as error:
        problems.append(f"bucket {names.bucket}: {error}")
    if problems:
        raise RuntimeError("cleanup could not delete: " + "; ".join(problems))
    log.info("deleted the run's subscriptions %s, topics %s and %s", subscriptions, topics,
             "bucket" if names.bucket_is_run_scoped else "prefix")
    return {"deleted_topics": topics, "deleted_subscriptions": subscriptions,
            "deleted_bucket": names.bucket if names.bucket_is_run_scoped else None}


def delete_run_bucket(config: GpuflowConfig, names: ResourceNames, conn_id: str) -> None:
    """The run's own bucket, once ``check_run_bucket`` proves it is: one that is not (another run's, another
    project's) is left as it is, with a warning."""
    _, gcs = _hooks(config, conn_id)
    if not _bucket_readable(gcs, names.bucket):
        return
    try:
        check_run_bucket(gcs.get_conn().get_bucket(names.bucket), config, names, conn_id)
    except RuntimeError as error:
        log.warning("left bucket gs://%s as it is: %s", names.bucket, error)
        return
    delete_whole_bucket(config, conn_id, names.bucket)


def delete_whole_bucket(config: GpuflowConfig, conn_id: str, bucket: str) -> None:
    """A run's own bucket: its objects, then itself (one that is gone is fine)."""
    _, gcs = _hooks(config, conn_id)
    if _bucket_readable(gcs, bucket):
        for blob_name in gcs.list(bucket):
            gcs.delete(bucket, blob_name)
        gcs.delete_bucket(bucket_name=bucket, force=True)


def delete_subscriptions(config: GpuflowConfig, conn_id: str, subscriptions: list[str],
                         raise_errors: bool = True) -> list[str]:
    """Delete each (one that is gone is fine); the problems, or raise them."""
    pubsub_hook, _ = _hooks(config, conn_id)
    return _each(subscriptions, "subscription", raise_errors, lambda subscription: pubsub_hook.delete_subscription(
        subscription=subscription, project_id=config.project, fail_if_not_exists=False))


def delete_topics(config: GpuflowConfig, conn_id: str, topics: list[str], raise_errors: bool = True) -> list[str]:
    pubsub_hook, _ = _hooks(config, conn_id)
    return _each(topics, "topic", raise_errors, lambda topic: pubsub_hook.delete_topic(
        topic=topic, project_id=config.project, fail_if_not_exists=False))


def _each(items: list[str], kind: str, raise_errors: bool, delete: Callable[[str], object]) -> list[str]:
    problems = []
    for item in items:
        try:
            delete(item)
        except Exception as error:  # keep going: one stuck resource must not leak the others
            problems.append(f"{kind} {item}: {error}")
    if problems and raise_errors:
        raise RuntimeError("could not delete: " + "; ".join(problems))
    return problems


def delete_objects(config: GpuflowConfig, conn_id: str, folder_uri: str) -> int:
    """Delete every object under a gs:// folder of a bucket that stays; how many there were."""
    _, gcs = _hooks(config, conn_id)
    bucket, prefix = split_gcs_uri(folder_uri)
    if not _bucket_readable(gcs, bucket):
        return 0
    names = gcs.list(bucket, prefix=prefix)
    for blob_name in names:
        gcs.delete(bucket, blob_name)
    return len(names)


def list_labeled(config: GpuflowConfig, conn_id: str, prefix: str | tuple[str, ...]) -> dict[str, dict[str, dict[str, str]]]:
    """The project's topics and subscriptions whose names start with ``prefix`` (or one of several), each with
    its labels (the janitor's proof of ownership: a name proves nothing)."""
    pubsub, _ = _hooks(config, conn_id)
    project_path = f"projects/{config.project}"
    topics = {t.name.rsplit("/", 1)[-1]: dict(t.labels)
              for t in pubsub.get_conn().list_topics(request={"project": project_path})}
    subscriptions = {s.name.rsplit("/", 1)[-1]: dict(s.labels)
                     for s in pubsub.subscriber_client.list_subscriptions(request={"project": project_path})}
    return {"topics": {name: topics[name] for name in sorted(topics) if name.startswith(prefix)},
            "subscriptions": {name: subscriptions[name] for name in sorted(subscriptions) if name.startswith(prefix)}}


def list_named(config: GpuflowConfig, conn_id: str, prefix: str | tuple[str, ...]) -> dict[str, list[str]]:
    """The project's topics and subscriptions whose names start with ``prefix`` (or one of several)."""
    return {kind: list(found) for kind, found in list_labeled(config, conn_id, prefix).items()}


def list_run_resources(config: GpuflowConfig, names: ResourceNames, conn_id: str) -> dict[str, list[str]]:
    """What still exists of the run (topics, subscriptions, bucket); used by tests and cleanup checks."""
    _, gcs = _hooks(config, conn_id)
    return {**list_named(config, conn_id, names.prefix),
            "buckets": [names.bucket] if names.bucket_is_run_scoped and _bucket_readable(gcs, names.bucket) else []}
