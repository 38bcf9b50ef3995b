"""gpuflow_janitor: find what gpuflow left behind that nothing owns any more, and delete it (or list it).

**Ownership is what gpuflow wrote when it made a resource, never a name.** Any team may name a topic ``gfd-…``, and
a subscription with a backlog is data. So the janitor deletes only:

* topics, subscriptions, buckets and jobs that carry gpuflow's labels (``gpuflow-run``, ``gpuflow-deployment``;
  local pipeline processes carry them in their environment), and whose labels agree with their names (a label of
  run X on a resource named for run Y is left alone);
* objects under ``gpuflow/<run>/`` with the run's lease (``run.json``) beside them, and deployment folders with the
  deployment's owner mark (``owner.json``): objects have no labels, so the lease and the mark carry the run's;
* of all these, only what its own site's DAGs made (the ``gpuflow-site`` label): sites may share a project, and a
  janitor reads its own site's records and leases only, so another site's live deployment would look abandoned.

Whatever is named like gpuflow's but lacks that proof (made by someone else, or by a gpuflow version before labels)
is never deleted: the log and the XCom (``left_alone``) list each one with why.

Of what is gpuflow's, it keeps what a running (or queued) DAG run owns (the run's lease names its DAG run, which it
asks Airflow about), a deployment such a run is creating, and a recorded deployment's topics, subscriptions, model
folder and serving job. Everything else is left over by a killed worker, a deleted DAG run or a teardown that died:
jobs are cancelled first, so nothing bills, then the rest is deleted.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform import JobFinder
from gpuflow.platform.records import DEPLOYMENT_MARK, Records
from gpuflow.runs.naming import DEPLOYMENTS_FOLDER, SITE_LABEL, deployment_folder, deployment_prefix

log = logging.getLogger(__name__)

RUN_HEX = re.compile(r"gf-([0-9a-f]{10})(?:-|$)")
RUN_PREFIX = re.compile(r"gf-[0-9a-f]{10}")
DEPLOYMENT_RUN_HEX = re.compile(r"-([0-9a-f]{10})(?:-|$)")
LIVE_STATES = {"running", "queued"}

#: (dag_id, run_id) -> the run's state, or None when Airflow has no such run.
DagRunState = Callable[[str, str], str | None]


class Ownership:
    """Which runs and deployments still own what carries their names."""

    def __init__(self, records: Records, dagrun_state: DagRunState):
        self.records, self.dagrun_state = records, dagrun_state
        self.recorded = {record.name: record for record in records.recorded()}
        self._runs: dict[str, bool] = {}
        self._leases: dict[str, dict[str, Any] | None] = {}
        self.leased_deployments: set[str] = set()

    def lease(self, prefix: str, bucket: str | None = None) -> dict[str, Any] | None:
        """The run's lease (in the configured bucket, or its own ``bucket``), read once."""
        if prefix not in self._leases:
            self._leases[prefix] = self.records.read_lease(prefix, bucket)
        return self._leases[prefix]

    def run_live(self, prefix: str, bucket: str | None = None) -> bool:
        """Whether the run's DAG run still runs, by its lease."""
        if prefix not in self._runs:
            lease = self.lease(prefix, bucket)
            state = None
            if lease:
                try:
                    state = self.dagrun_state(lease["dag_id"], lease["run_id"])
                except Exception as error:  # a deleted DAG run: Airflow has no state for it
                    log.info("run %s (%s %s): %s", prefix, lease["dag_id"], lease["run_id"], error)
            self._runs[prefix] = str(state).lower().rsplit(".", 1)[-1] in LIVE_STATES
            if self._runs[prefix] and lease and lease.get("deployment"):
                self.leased_deployments.add(lease["deployment"])
            log.info("run %s: %s", prefix, f"DAG run {lease['dag_id']} {lease['run_id']} is {state}" if lease
                     else "no lease")
        return self._runs[prefix]

    def deployment_live(self, deployment: str) -> bool:
        return deployment in self.recorded or deployment in self.leased_deployments

    def deployment_of(self, name: str) -> str | None:
        """The live deployment (recorded, or being created by a live run) whose prefix ``name`` carries."""
        for deployment in sorted({*self.recorded, *self.leased_deployments}, key=len, reverse=True):
            if name.startswith(deployment_prefix(deployment) + "-"):
                return deployment
        return None

    def owned(self, name: str, job_id: str | None = None) -> bool:
        """Whether a resource named ``name`` (a job: also its id) still has an owner."""
        if job_id is not None and any(r.job.get("id") == job_id for r in self.recorded.values()):
            return True
        if name.startswith("gfd-"):
            deployment = self.deployment_of(name)
            if deployment is None:
                return False
            run = DEPLOYMENT_RUN_HEX.search(name[len(deployment_prefix(deployment)):])
            record = self.recorded.get(deployment)
            if run is None or (record and name == record.subscription):
                return True  # the deployment's own topics, its shared subscription, its serving subscription
            return self.run_live(f"gf-{run.group(1)}")  # a job or job subscription a run started for it
        run = RUN_HEX.match(name) or RUN_HEX.search(name)
        return run is not None and self.run_live(f"gf-{run.group(1)}")


def label_disagreement(name: str, labels: dict[str, str]) -> str | None:
    """Why a resource named like gpuflow's is not provably gpuflow's; None when its labels agree with its name."""
    run, deployment = labels.get("gpuflow-run"), labels.get("gpuflow-deployment")
    if not run and not deployment:
        return ("no gpuflow labels (gpuflow-run, gpuflow-deployment): made by someone else, or by a gpuflow version "
                "before labels")
    if name.startswith("gfd-"):
        if not deployment or not (name + "-").startswith(deployment_prefix(deployment) + "-"):
            return f"named for a deployment, but labelled gpuflow-deployment={deployment}"
        named_run = DEPLOYMENT_RUN_HEX.search(name[len(deployment_prefix(deployment)):])
    else:
        named_run = RUN_HEX.search(name)
        if named_run is None:
            return f"named for no gpuflow run, but labelled gpuflow-run={run}"
    if named_run and run != f"gf-{named_run.group(1)}":
        return f"named for run gf-{named_run.group(1)}, but labelled gpuflow-run={run}"
    return None


def _site(site: str) -> str:
    return f"site {site}" if site else "no site"


class Claims:
    """What the janitor may judge: gpuflow's by its labels or owner marks, and its own ``site``'s. The rest is left
    alone, with why."""

    def __init__(self, site: str) -> None:
        self.site = site
        self.left_alone: list[dict[str, str]] = []

    def other_site(self, labels: dict[str, str]) -> str | None:
        made_by = labels.get(SITE_LABEL, "")
        if made_by == self.site:
            return None
        return f"made by {_site(made_by)}'s DAGs; this janitor judges {_site(self.site)}'s only"

    def claim(self, kind: str, found: dict[str, dict[str, str]],
              why_not: Callable[[str, dict[str, str]], str | None] = label_disagreement) -> list[str]:
        """The names among ``found`` (name -> labels, or the labels its lease or owner mark names) that are
        gpuflow's and this site's; each other one is left alone, logged."""
        mine = []
        for name, labels in found.items():
            why = why_not(name, labels) or self.other_site(labels)
            if why:
                self.left_alone.append({"kind": kind, "name": name, "why": why})
                log.warning("left alone: %s %s (%s)", kind, name, why)
            else:
                mine.append(name)
        return mine


def find_leftovers(config: GpuflowConfig, platform: JobFinder, dagrun_state: DagRunState) -> dict[str, list[Any]]:
    """What gpuflow made (by its labels and owner marks) that no running DAG run and no recorded deployment owns,
    and, under ``left_alone``, what is named like gpuflow's but is not provably its."""
    from gpuflow.steps.resources import list_labeled

    records = Records(config, platform.conn_id)
    ownership = Ownership(records, dagrun_state)
    claims = Claims(config.site)

    def lease_labels(prefix: str, bucket: str | None = None) -> dict[str, str]:
        labels: dict[str, str] = (ownership.lease(prefix, bucket) or {}).get("labels", {})
        return labels

    # Where the storage service keeps no bucket labels (the GCS emulator drops them), the lease inside says.
    buckets = {bucket: bucket_run(bucket) for bucket in claims.claim("bucket", {
        bucket: labels or lease_labels(bucket_run(bucket), bucket)
        for bucket, labels in _run_buckets(config, records).items()})}
    prefixes = claims.claim("objects under gpuflow/", {
        prefix: lease_labels(prefix) for prefix in _object_prefixes(config, records)},
        lambda prefix, _: None if ownership.lease(prefix) else "no run.json lease beside them")
    live = {prefix: ownership.run_live(prefix) for prefix in prefixes}
    live.update({prefix: ownership.run_live(prefix, bucket) for bucket, prefix in buckets.items()})
    # (asking first also learns which deployments live runs are creating, before their resources are judged)
    found = list_labeled(config, platform.conn_id, ("gf-", "gfd-"))  # one listing of each kind
    jobs = platform.find_gpuflow_jobs()
    labelled_jobs = set(claims.claim("job", {job.name: platform.job_labels(job) for job in jobs}))
    marks = {name: records.read_owner_mark(name) for name in _deployment_folders(config, records)}
    folders = claims.claim("deployment folder", {name: (mark or {}).get("labels", {}) for name, mark in marks.items()},
                           lambda name, _: None if marks[name] else f"no {DEPLOYMENT_MARK} owner mark")
    return {
        "jobs": [job.to_xcom() for job in jobs if job.name in labelled_jobs and not ownership.owned(job.name, job.id)],
        "subscriptions": [name for name in claims.claim("subscription", found["subscriptions"])
                          if not ownership.owned(name)],
        "topics": [name for name in claims.claim("topic", found["topics"]) if not ownership.owned(name)],
        "buckets": [bucket for bucket, prefix in buckets.items() if not live[prefix]],
        "prefixes": [f"gs://{config.bucket}/gpuflow/{prefix}/" for prefix in prefixes if not live[prefix]]
        + [deployment_folder(config, name) + "/" for name in folders if not ownership.deployment_live(name)],
        "left_alone": claims.left_alone,
    }


def bucket_run(bucket: str) -> str:
    """A run bucket is named <project>-gf-<hex>: its run prefix."""
    match = RUN_HEX.search(bucket)
    return f"gf-{match.group(1)}" if match else bucket


def _run_buckets(config: GpuflowConfig, records: Records) -> dict[str, dict[str, str]]:
    """Buckets named like run-scoped ones (a run without a bucket configured makes <project>-gf-<hex>), with their
    labels."""
    client = records.gcs.get_conn()
    return {b.name: dict(b.labels or {}) for b in sorted(client.list_buckets(prefix=f"{config.project}-gf-"),
                                                          key=lambda b: b.name) if RUN_HEX.search(b.name)}


def _object_prefixes(config: GpuflowConfig, records: Records) -> list[str]:
    """The run prefixes (gf-<hex>) that have objects in the configured bucket."""
    if not config.bucket:
        return []
    names = records.gcs.list(config.bucket, prefix="gpuflow/gf-")
    return sorted({name.split("/")[1] for name in names if RUN_PREFIX.fullmatch(name.split("/")[1])})


def _deployment_folders(config: GpuflowConfig, records: Records) -> list[str]:
    if not config.bucket:
        return []
    return sorted({name.split("/")[2] for name in records.gcs.list(config.bucket, prefix=f"{DEPLOYMENTS_FOLDER}/")
                   if name.count("/") >= 3})


def clean_up(config: GpuflowConfig, platform: JobFinder, leftovers: dict[str, list[Any]]) -> dict[str, Any]:
    """Delete what ``find_leftovers`` found (its jobs were asked to stop first); what fails is reported, not hidden."""
    from gpuflow.steps.resources import delete_objects, delete_subscriptions, delete_topics, delete_whole_bucket

    problems = [*delete_subscriptions(config, platform.conn_id, leftovers["subscriptions"], raise_errors=False),
                *delete_topics(config, platform.conn_id, leftovers["topics"], raise_errors=False)]
    for bucket in leftovers["buckets"]:
        try:
            delete_whole_bucket(config, platform.conn_id, bucket)
        except Exception as error:
            problems.append(f"bucket {bucket}: {error}")
    for folder in leftovers["prefixes"]:
        try:
            delete_objects(config, platform.conn_id, folder)
        except Exception as error:
            problems.append(f"{folder}: {error}")
    if problems:
        raise RuntimeError("the janitor could not delete: " + "; ".join(problems))
    return leftovers


def describe(leftovers: dict[str, list[Any]]) -> str:
    lines = []
    for kind, items in leftovers.items():
        if kind == "left_alone":
            shown = [f"{item['kind']} {item['name']} ({item['why']})" for item in items]
        else:
            shown = [item["name"] + f" ({item['id']})" if isinstance(item, dict) else item for item in items]
        lines.append(f"  {kind}: {', '.join(shown) if shown else 'none'}")
    return "\n".join(lines)
