"""gcp: what a new project most often lacks before a first run, found before anything is created.

The APIs the workflow's steps call, the caller's permissions for them, the workers' service account, the
organization policies that stop workers, and the bucket. The facts come from an ``AccessProbe`` (the gcp
platform's, ``gpuflow.platform.gcp_access``); these rules only judge them. What the probe cannot read is
``unknown``, with why and the command that would tell, and never an error by itself. The needs, permissions, roles
and their sources are data: ``gpuflow/catalog/access.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from gpuflow.catalog import AccessNeed, access_needs, access_table
from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform.access_facts import AccessProbe, AccessUnknown, EffectivePolicy, describe_policy
from gpuflow.preflight.findings import Finding, error, info, unknown, warning

#: The kinds of step (access.yaml's needs) each workflow runs. Its preflight asks for these only.
WORKFLOW_NEEDS: dict[str, tuple[str, ...]] = {
    "inference": ("quota", "storage", "pubsub", "export", "build", "dataflow", "gpu_usage"),
    "batch": ("quota", "storage", "export", "build", "dataflow"),
    "dataproc": ("storage", "dataproc"),
    "maintenance": ("storage", "pubsub", "dataflow"),  # the teardown and the janitor: list, stop, delete
    "quota_report": ("quota",),
}

#: The workflows that start Dataflow workers: their service account and the external-IP policy matter.
DATAFLOW_WORKFLOWS = {"inference", "batch"}
#: The workflows that create jobs in the region: the locations policy matters.
REGIONAL_WORKFLOWS = {"inference", "batch", "dataproc"}

#: Where a fix names the caller and the probe could not tell who that is.
MEMBER_PLACEHOLDER = "MEMBER"


def needs_of(config: GpuflowConfig, workflow: str) -> list[AccessNeed]:
    """The catalog's needs of the workflow's steps (CPU workers read no GPU usage)."""
    names = [name for name in WORKFLOW_NEEDS[workflow] if name != "gpu_usage" or config.uses_gpu]
    catalog = access_needs()
    return [catalog[name] for name in names]


def access_findings(config: GpuflowConfig, workflow: str, probe: AccessProbe) -> list[Finding]:
    """Every access check of the workflow, each one's unknowns reported, none skipped for another's failure."""
    needs = needs_of(config, workflow)
    checks: list[Callable[[], Iterable[Finding]]] = [
        lambda: apis_enabled(config, needs, probe),
        lambda: caller_permissions(config, needs, probe),
    ]
    if workflow in DATAFLOW_WORKFLOWS:
        checks += [lambda: worker_service_account(config, probe, workflow),
                   lambda: external_ips_allowed(config, probe)]
    if any(need.name == "build" for need in needs):
        checks.append(lambda: build_service_account(config, probe))
    if any(need.name == "export" for need in needs):
        checks.append(lambda: export_identity(config))
    if workflow in REGIONAL_WORKFLOWS:
        checks.append(lambda: region_allowed(config, probe))
    if config.bucket and any(need.name == "storage" for need in needs):
        checks.append(lambda: bucket_usable(config, probe))
    findings: list[Finding] = []
    for check in checks:
        try:
            findings += list(check())
        except AccessUnknown as problem:
            findings.append(unknown("project", problem.why, problem.command))
    return findings


def member(probe: AccessProbe) -> str:
    return probe.caller() or MEMBER_PLACEHOLDER


def _who(probe: AccessProbe) -> str:
    caller = probe.caller()
    return caller if caller else "the connection's identity"


def _member_note(probe: AccessProbe) -> str:
    return "" if probe.caller() else f" ({MEMBER_PLACEHOLDER}: the connection's identity, e.g. serviceAccount:EMAIL)"


# -- the checks ----------------------------------------------------------------------------------


def apis_enabled(config: GpuflowConfig, needs: list[AccessNeed], probe: AccessProbe) -> Iterator[Finding]:
    """The workflow's APIs, and those this check reads with (off, its other checks could only say unknown)."""
    own = set(access_table("check_reads")["apis"])
    services = sorted({api for need in needs for api in need.apis} | own)
    disabled = probe.disabled_services(services)
    if disabled:
        steps = ", ".join([need.what for need in needs if set(need.apis) & set(disabled)]
                          + (["read what this access check reads"] if own & set(disabled) else []))
        yield error("project", f"APIs not enabled in {config.project}: {', '.join(disabled)} (needed to {steps})",
                    f"gcloud services enable {' '.join(disabled)} --project={config.project}")


def caller_permissions(config: GpuflowConfig, needs: list[AccessNeed], probe: AccessProbe) -> Iterator[Finding]:
    wanted = {permission: role for need in needs for permission, role in need.permissions.items()}
    missing = probe.missing_project_permissions(sorted(wanted))
    if not missing:
        return
    by_role: dict[str, list[str]] = {}
    for permission in missing:
        by_role.setdefault(wanted[permission], []).append(permission)
    grants = "; ".join(f"gcloud projects add-iam-policy-binding {config.project} --member={member(probe)} "
                       f"--role={role}" for role in sorted(by_role))
    held_by = "; ".join(f"{role}: {', '.join(permissions)}" for role, permissions in sorted(by_role.items()))
    yield error("gcp_conn_id", f"{_who(probe)} lacks {len(missing)} permission(s) on {config.project} that this "
                f"workflow's steps use ({held_by})", grants + _member_note(probe))


def worker_account(config: GpuflowConfig, probe: AccessProbe) -> str:
    """The workers' service account: the configured one, else Compute Engine's default one."""
    if config.dataflow.service_account:
        return config.dataflow.service_account
    return f"{probe.project_number()}-compute@developer.gserviceaccount.com"


def worker_service_account(config: GpuflowConfig, probe: AccessProbe, workflow: str = "inference"
                           ) -> Iterator[Finding]:
    table = access_table("worker_service_account")
    field = "dataflow.service_account"
    try:
        email = worker_account(config, probe)
    except AccessUnknown as problem:
        yield unknown(field, f"the Compute Engine default service account's name needs the project number, and "
                      f"{problem.why}", f"{problem.command}, or set {field}")
        return
    if not probe.service_account_exists(email):
        yield error(field, f"the workers' service account {email} does not exist",
                    f"create it (gcloud iam service-accounts create NAME --project={config.project}) and set {field}"
                    if config.dataflow.service_account else
                    f"set {field} to an existing account: Compute Engine's default one is gone in {config.project}")
        return
    act_as = table["act_as"]
    if probe.missing_service_account_permissions(email, [act_as["permission"]]):
        yield error(field, f"{_who(probe)} may not launch jobs (the Dataflow workers and the Vertex AI export) as "
                    f"{email} (no {act_as['permission']})",
                    f"gcloud iam service-accounts add-iam-policy-binding {email} --project={config.project} "
                    f"--member={member(probe)} --role={act_as['role']}" + _member_note(probe))
    yield from _worker_roles(config, probe, email, table, workflow)


def build_service_account(config: GpuflowConfig, probe: AccessProbe) -> Iterator[Finding]:
    """The account Cloud Build runs the image build as (gpuflow names none, so the project's default), named, and
    whether it may write logs, read the context and push the image: else the build fails after the export billed."""
    table, field = access_table("build_service_account"), "container.repository"
    email = probe.build_account()
    if email is None:
        yield error(field, f"Cloud Build has no default service account in {config.region} for {config.project}",
                    f"gcloud builds get-default-service-account --region={config.region} --project={config.project}"
                    " says why; a project's organization settings choose it (docs/gcp.md)")
        return
    account = f"serviceAccount:{email}"
    try:
        roles = probe.project_roles(account)
    except AccessUnknown as problem:
        yield unknown(field, f"builds run as {email}; whether it holds {', '.join(table['needs'])}: {problem.why}",
                      problem.command)
        return
    held = roles & set(table["sufficient_roles"])
    missing = [] if held else [role for role in table["needs"] if role not in roles]
    runs_as = f"builds run as {email} (Cloud Build's default in {config.region})"
    if not missing:
        yield info(field, runs_as + (f", which holds {', '.join(sorted(held))}" if held else ""), "nothing to do")
        return
    why = "; ".join(f"{role}: {table['needs'][role]}" for role in missing)
    yield error(field, f"{runs_as}, which lacks {why}",
                "; ".join(f"gcloud projects add-iam-policy-binding {config.project} --member={account} --role={role}"
                          for role in missing))


def export_identity(config: GpuflowConfig) -> Iterator[Finding]:
    """Name the identity the Vertex AI export runs as: the workers' account (``platform.gcp_vertex`` sets it as the
    custom job's service_account), or Vertex AI's default where none is set."""
    field = "dataflow.service_account"
    email = config.dataflow.service_account
    if not email:
        yield info(field, "the Vertex AI export runs as Vertex AI's default identity for custom training (no "
                   "dataflow.service_account; cloud.google.com/vertex-ai/docs/general/custom-service-account)",
                   f"set {field} to run it, and the workers, as one account you chose")
        return
    yield info(field, f"the Vertex AI export runs as {email} ({field}, the workers' account too: the caller's "
               "iam.serviceAccounts.actAs on it is checked with the workers')", "nothing to do")


def _worker_roles(config: GpuflowConfig, probe: AccessProbe, email: str, table: dict[str, Any],
                  workflow: str) -> Iterator[Finding]:
    field, account = "dataflow.service_account", f"serviceAccount:{email}"
    grant = f"gcloud projects add-iam-policy-binding {config.project} --member={account} --role="
    try:
        roles = probe.project_roles(account)
    except AccessUnknown as problem:
        yield unknown(field, f"whether {email} holds {table['worker_role']} and may read the image and the bucket: "
                      f"{problem.why}", problem.command)
        return
    if table["worker_role"] not in roles:
        yield error(field, f"the workers' service account {email} lacks {table['worker_role']}; its workers would "
                    "not start", grant + table["worker_role"])
    yield from _worker_reads_registry(config, probe, email, roles, table)
    if workflow in table["pubsub_workflows"]:
        for use, accepted in (("pull prompts from its subscription", table["pubsub_roles"]["consume"]),
                              ("publish answers and dead letters", table["pubsub_roles"]["publish"])):
            if not roles & set(accepted):  # the first role listed is the least that grants it
                yield error(field, f"the workers' service account {email} may not {use} (none of "
                            f"{', '.join(accepted)}): the streaming job would answer nothing", grant + accepted[0])
    if roles & set(table["bucket_roles"]):
        return
    if config.bucket:
        try:
            if probe.bucket_roles(config.bucket, account) & set(table["bucket_roles"]):
                return
        except AccessUnknown as problem:
            yield unknown(field, f"whether {email} may use gs://{config.bucket}: {problem.why}", problem.command)
            return
    yield error(field, f"{email} may not read and write the run's bucket (none of {', '.join(table['bucket_roles'])} "
                "on the project" + (f" or on gs://{config.bucket})" if config.bucket else ")"),
                f"gcloud storage buckets add-iam-policy-binding gs://{config.bucket} --member={account} "
                "--role=roles/storage.objectAdmin" if config.bucket else grant + "roles/storage.objectAdmin")


def _worker_reads_registry(config: GpuflowConfig, probe: AccessProbe, email: str, roles: set[str],
                           table: dict[str, Any]) -> Iterator[Finding]:
    """The image's repository: a role on the project, else on the repository itself."""
    readers, account, repository = set(table["registry_read_roles"]), f"serviceAccount:{email}", \
        config.container.repository
    if roles & readers:
        return
    try:
        if probe.repository_roles(repository, account) & readers:
            return
    except AccessUnknown as problem:
        yield unknown("dataflow.service_account", f"whether {email} may pull from the repository {repository}: "
                      f"{problem.why}", problem.command)
        return
    yield error("dataflow.service_account", f"{email} may not pull the worker image from Artifact Registry (none of "
                f"{', '.join(sorted(readers))} on {config.project} or on the repository {repository})",
                f"gcloud artifacts repositories add-iam-policy-binding {repository} --location={config.region} "
                f"--project={config.project} --member={account} --role=roles/artifactregistry.reader")


def forbids_external_ips(policy: EffectivePolicy) -> bool:
    """Dataflow's workers are new VMs: any list of allowed instances leaves them out."""
    return policy.deny_all or (not policy.allow_all and bool(policy.allowed))


def external_ips_allowed(config: GpuflowConfig, probe: AccessProbe) -> Iterator[Finding]:
    constraint = access_table("org_policies")["external_ip"]["constraint"]
    policy = probe.effective_policy(constraint)
    if policy.conditional:
        yield unknown("dataflow.use_public_ips", f"{constraint} has a conditional rule on {config.project}",
                      describe_policy(constraint, config.project))
        return
    if not forbids_external_ips(policy):
        return
    if config.dataflow.use_public_ips:
        yield error("dataflow.use_public_ips", f"{constraint} forbids external IPs on {config.project}, and the "
                    "workers would ask for them, so none would start",
                    "set dataflow.use_public_ips: false and dataflow.subnetwork to a subnetwork of "
                    f"{config.region} with Private Google Access")
        return
    if not config.dataflow.subnetwork:
        yield error("dataflow.subnetwork", "workers without external IPs reach Google's APIs only through Private "
                    "Google Access on their subnetwork, and none is set",
                    f"set dataflow.subnetwork: regions/{config.region}/subnetworks/SUBNET (one with Private Google "
                    "Access)")
        return
    private_access = probe.subnetwork_private_google_access(config.dataflow.subnetwork)
    if private_access is None:
        yield error("dataflow.subnetwork", f"{config.dataflow.subnetwork} does not exist in {config.region}",
                    f"gcloud compute networks subnets list --filter=region:{config.region} --project={config.project}"
                    ", and set dataflow.subnetwork to one of them")
    elif not private_access:  # a warning: Private Service Connect is the other documented way to reach them
        yield warning("dataflow.subnetwork", f"{config.dataflow.subnetwork} has no Private Google Access, so workers "
                      "without external IPs reach Google's APIs only if the network has another route to them "
                      "(Private Service Connect: docs.cloud.google.com/vpc/docs/private-service-connect)",
                    f"gcloud compute networks subnets update {config.dataflow.subnetwork.rsplit('/', 1)[-1]} "
                    f"--region={config.region} --project={config.project} --enable-private-ip-google-access")


_REGION = re.compile(r"^(?:in:)?(?P<region>[a-z]+-[a-z]+\d+)(?:-[a-z])?(?:-locations)?$")


def _region_of(value: str) -> str | None:
    """The region a location value names (a region, a zone, or their ``in:…-locations`` group); None for a wider
    group (``in:us-locations``) that gpuflow does not expand."""
    found = _REGION.match(value)
    return found["region"] if found else None


def location_allowed(policy: EffectivePolicy, region: str) -> bool | None:
    """Whether jobs may run in the region; None where only value groups wider than a region could allow it."""
    if policy.deny_all or any(_region_of(value) == region for value in policy.denied):
        return False
    if policy.allow_all or not policy.allowed:
        return True
    regions = [_region_of(value) for value in policy.allowed]
    if region in regions:
        return True
    return None if None in regions else False


def region_allowed(config: GpuflowConfig, probe: AccessProbe) -> Iterator[Finding]:
    constraint = access_table("org_policies")["locations"]["constraint"]
    policy = probe.effective_policy(constraint)
    describe = describe_policy(constraint, config.project)
    allowed = None if policy.conditional else location_allowed(policy, config.region)
    if allowed is False:
        yield error("region", f"{constraint} does not allow {config.region} on {config.project}",
                    f"set region to an allowed location ({describe})")
    elif allowed is None:
        yield unknown("region", f"{constraint} allows {', '.join(policy.allowed)}, value groups that gpuflow does not "
                      f"expand", f"check that {config.region} is among them: {describe}")


def bucket_usable(config: GpuflowConfig, probe: AccessProbe) -> Iterator[Finding]:
    if config.bucket is None:  # only called with a bucket (check_access)
        return
    bucket = probe.bucket(config.bucket)
    if bucket is None:  # setup creates it (its caller's storage.buckets.create is checked above), and keeps it
        yield info("bucket", f"gs://{config.bucket} does not exist yet: the run's setup creates it in {config.region} "
                   "and keeps it", f"nothing, unless the name is a typo; to make it yourself: gcloud storage buckets "
                   f"create gs://{config.bucket} --project={config.project} --location={config.region}")
        return
    if bucket.location.lower() != config.region.lower():
        yield warning("bucket", f"gs://{config.bucket} is in {bucket.location}, away from the workers in "
                      f"{config.region}: every read and write crosses regions (slower, and billed as egress)",
                      f"use a bucket in {config.region}")
    wanted = ["storage.objects.create", "storage.objects.get", "storage.objects.list", "storage.objects.delete"]
    missing = probe.missing_bucket_permissions(config.bucket, wanted)
    if missing:
        yield error("bucket", f"{_who(probe)} lacks {', '.join(missing)} on gs://{config.bucket}",
                    f"gcloud storage buckets add-iam-policy-binding gs://{config.bucket} --member={member(probe)} "
                    "--role=roles/storage.objectAdmin" + _member_note(probe))
