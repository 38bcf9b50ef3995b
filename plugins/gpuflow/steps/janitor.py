"""gpuflow_janitor: find what gpuflow left behind that nothing owns any more, and delete it (or list it).

Every gpuflow resource carries its owner in its name (and, where the API has them, the labels ``gpuflow-run`` and
``gpuflow-deployment``): ``gf-<run>-…`` belongs to a DAG run, ``gfd-<deployment>-…`` to a deployment. A run writes
a lease (``run.json``: its DAG id and run id) beside its objects before it creates anything else, so the janitor
can ask Airflow whether that run still runs. It keeps:

* what a running (or queued) DAG run owns, and a deployment that run is creating;
* a recorded deployment's topics, subscriptions, model folder and serving job.

Everything else gpuflow-named is left over by a killed worker, a deleted DAG run or a teardown that died: jobs,
topics, subscriptions, run buckets and run prefixes in the bucket. Jobs are cancelled first, so nothing bills.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

from gpuflow.config import GpuflowConfig
from gpuflow.naming import DEPLOYMENTS_FOLDER, deployment_folder, deployment_prefix
from gpuflow.platform import Platform
from gpuflow.platform.records import Records

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
        self.leased_deployments: set[str] = set()

    def run_live(self, prefix: str) -> bool:
        if prefix not in self._runs:
            lease = self.records.read_lease(prefix)
            state = None
            if lease:
                try:
                    state = self.dagrun_state(lease["dag_id"], lease["run_id"])
                except Exception as error:  # a deleted DAG run: Airflow has no state for it
                    log.info("run %s (%s %s): %s", prefix, lease["dag_id"], lease["run_id"], error)
            self._runs[prefix] = str(state).lower().rsplit(".", 1)[-1] in LIVE_STATES
            if self._runs[prefix] and lease.get("deployment"):
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


def find_leftovers(config: GpuflowConfig, platform: Platform, dagrun_state: DagRunState) -> dict[str, list]:
    """What gpuflow made that no running DAG run and no recorded deployment owns."""
    from gpuflow.steps.resources import list_named

    records = Records(config, platform.conn_id)
    ownership = Ownership(records, dagrun_state)
    buckets = {bucket: bucket_run(bucket) for bucket in _run_buckets(config, records)}
    prefixes = _object_prefixes(config, records)
    live = {prefix: ownership.run_live(prefix) for prefix in sorted({*prefixes, *buckets.values()})}
    # (asking first also learns which deployments live runs are creating, before their resources are judged)
    found = list_named(config, platform.conn_id, ("gf-", "gfd-"))  # one listing of each kind
    jobs = platform.find_gpuflow_jobs()
    return {
        "jobs": [job.to_xcom() for job in jobs if not ownership.owned(job.name, job.id)],
        "subscriptions": [name for name in found["subscriptions"] if not ownership.owned(name)],
        "topics": [name for name in found["topics"] if not ownership.owned(name)],
        "buckets": [bucket for bucket, prefix in buckets.items() if not live[prefix]],
        "prefixes": [f"gs://{config.bucket}/gpuflow/{prefix}/" for prefix in prefixes if not live[prefix]]
        + [deployment_folder(config, name) + "/" for name in _deployment_folders(config, records)
           if not ownership.deployment_live(name)],
    }


def bucket_run(bucket: str) -> str:
    """A run bucket is named <project>-gf-<hex>: its run prefix."""
    match = RUN_HEX.search(bucket)
    return f"gf-{match.group(1)}" if match else bucket


def _run_buckets(config: GpuflowConfig, records: Records) -> list[str]:
    """Run-scoped buckets (a run without a bucket configured makes <project>-gf-<hex>)."""
    client = records.gcs.get_conn()
    return sorted(b.name for b in client.list_buckets(prefix=f"{config.project}-gf-") if RUN_HEX.search(b.name))


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


def clean_up(config: GpuflowConfig, platform: Platform, leftovers: dict[str, list]) -> dict[str, Any]:
    """Delete what ``find_leftovers`` found (its jobs were asked to stop first); what fails is reported, not hidden."""
    from gpuflow.steps.resources import delete_objects, delete_subscriptions, delete_topics, delete_whole_bucket

    problems = [*delete_subscriptions(config, platform.conn_id, leftovers["subscriptions"], raise_errors=False),
                *delete_topics(config, platform.conn_id, leftovers["topics"], raise_errors=False)]
    for bucket in leftovers["buckets"]:
        try:
            delete_whole_bucket(platform.conn_id, bucket)
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


def describe(leftovers: dict[str, list]) -> str:
    lines = []
    for kind, items in leftovers.items():
        shown = [item["name"] + f" ({item['id']})" if isinstance(item, dict) else item for item in items]
        lines.append(f"  {kind}: {', '.join(shown) if shown else 'none'}")
    return "\n".join(lines)
