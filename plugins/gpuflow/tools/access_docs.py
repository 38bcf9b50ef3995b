"""What a new Google Cloud project needs, as docs/gcp.md says it: generated from catalog/access.yaml (the same data
preflight's access check reads), so the page and the check cannot disagree (gpuflow.tools.generated)."""

from __future__ import annotations

from gpuflow.catalog import access_needs, access_table
from gpuflow.preflight.access_rules import WORKFLOW_NEEDS


def project_needs_markdown() -> str:
    needs = access_needs()
    apis = sorted({api for need in needs.values() for api in need.apis} | set(access_table("check_reads")["apis"]))
    lines = ["Enable the APIs once (each workflow's preflight checks only those its steps call):", "",
             "```", f"gcloud services enable {' '.join(apis)} --project=PROJECT", "```", "",
             "| workflow | its steps' needs |", "| --- | --- |"]
    lines += [f"| `{workflow}` | {', '.join(f'`{name}`' for name in names)} |" for workflow, names in WORKFLOW_NEEDS.items()]
    lines += ["", "What each need is, the APIs it calls, and the roles that grant its permissions to the identity Airflow "
              "uses (the Airflow connection's, after impersonation):", "",
              "| need | what | APIs | roles (permissions) | source |", "| --- | --- | --- | --- | --- |"]
    for need in needs.values():
        by_role: dict[str, list[str]] = {}
        for permission, role in need.permissions.items():
            by_role.setdefault(role, []).append(permission)
        roles = "<br>".join(f"`{role}` ({', '.join(permissions)})" for role, permissions in by_role.items())
        lines.append(f"| `{need.name}` | {need.what} | {', '.join(need.apis)} | {roles} | {need.source} |")
    account, build, reads, policies = (access_table(section) for section in
                                       ("worker_service_account", "build_service_account", "check_reads",
                                        "org_policies"))
    lines += ["", "The workers' service account (`dataflow.service_account`, else Compute Engine's default one, "
              "`PROJECT_NUMBER-compute@developer.gserviceaccount.com`):", "",
              f"- it holds `{account['worker_role']}`;",
              f"- it may pull the image (one of {', '.join(f'`{r}`' for r in account['registry_read_roles'])}) and use "
              f"the bucket (one of {', '.join(f'`{r}`' for r in account['bucket_roles'])}, on the project or the "
              "bucket);",
              f"- the streaming job's account may pull from its subscription (one of "
              f"{', '.join(f'`{r}`' for r in account['pubsub_roles']['consume'])}) and publish to its topics (one of "
              f"{', '.join(f'`{r}`' for r in account['pubsub_roles']['publish'])}); the first of each is the least;",
              f"- the identity Airflow uses holds `{account['act_as']['permission']}` on it "
              f"(`{account['act_as']['role']}`). The Vertex AI export runs as this account too: gpuflow always "
              "names it on the custom job, since left unset Vertex AI runs custom training as its Custom Code "
              "Service Agent (Vertex AI \"Use a custom service account\", "
              "cloud.google.com/vertex-ai/docs/general/custom-service-account).", "",
              f"Source: {' '.join(account['source'].split())}.",
              "", "Cloud Build's account (the project's default build service account: "
              "`gcloud builds get-default-service-account --region=REGION`) holds "
              + " or ".join(f"`{role}`" for role in build["sufficient_roles"]) + ", or each of: "
              + "; ".join(f"`{role}` ({what})" for role, what in build["needs"].items()) + ".", "",
              f"Source: {' '.join(build['source'].split())}.", "",
              "Organization policies that stop workers, read as effective policies:", ""]
    lines += [f"- `{policy['constraint']}`: {' '.join(policy['source'].split())}." for policy in policies.values()]
    lines += ["", "The check itself reads with "
              + ", ".join(f"`{role}` ({what})" for what, role in reads["roles"].items())
              + "; without them a check is `unknown`, with the command that would tell, never an error. "
              f"Source: {' '.join(reads['source'].split())}."]
    return "\n".join(lines)
