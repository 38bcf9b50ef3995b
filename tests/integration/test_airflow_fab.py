"""One Airflow, two sites, each team on its own site's DAGs: under the FAB auth manager, a role granted as Cloud
Composer's per-folder roles registration grants it acts on its own site's DAGs, and gets 403 on another site's.

Composer's "Airflow UI access control" page (docs.cloud.google.com/composer/docs/composer-3/airflow-rbac) says that
Airflow treats the User role as the template for custom roles, copying its permissions to them except those on all
DAGs, and that per-folder registration gives a folder's role DAG-level permissions on the DAGs in that folder. The
test builds the site's role so, through the FAB auth manager's REST API (``/auth/fab/v1/roles``), as an admin would
on an Airflow where the registration is not available (docs/security.md), then acts through Airflow's REST API as a
user of that role. An api-server alone: a trigger creates a queued run, and nothing needs to run it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.live, pytest.mark.timeout(600)]

SITES = ("team-a", "team-b")
SITE_USER = "team-a-engineer"
#: The DAG each request names: the site's janitor (its Params' defaults are a valid run).
DAG_NAME = "gpuflow_janitor"
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"


@pytest.fixture(scope="module")
def fab_airflow(tmp_path_factory, postgres_server):
    import json

    from gpuflow.sites import write_site_dag_file
    from tests.helpers import site_config
    from tests.live_airflow import USERNAME, LiveAirflow, database_name

    home = tmp_path_factory.mktemp("airflow-fab")
    site_dags = home / "site-dags"
    for site in SITES:
        write_site_dag_file(Path(site_config(f"{site}.yaml")), site_dags)
    bundle = [{"name": "gpuflow-sites", "classpath": "airflow.dag_processing.bundles.local.LocalDagBundle",
               "kwargs": {"path": str(site_dags)}}]
    live = LiveAirflow(home, postgres_server.database_url(database_name(home)), extra_env={
        "AIRFLOW__CORE__AUTH_MANAGER": FAB,
        "AIRFLOW__DAG_PROCESSOR__DAG_BUNDLE_CONFIG_LIST": json.dumps(bundle)})
    # The DAGs into the database, their DAG-level permissions (FAB's sync-perm), and an admin.
    admin = ("users", "create", "--username", USERNAME, "--password", live.password, "--role", "Admin",
             "--email", "admin@example.com", "--firstname", "Site", "--lastname", "Admin")
    try:
        live.start(components=("api-server",), setup=(("dags", "reserialize"), ("sync-perm", "--include-dags"),
                                                      admin))
        yield live
    finally:
        live.stop()


def fab(live, method: str, path: str, **kwargs):
    """A call to the FAB auth manager's own REST API, as the admin."""
    import requests

    return requests.request(method, f"{live.url}/auth/fab/v1{path}", timeout=30,
                            headers={"Authorization": f"Bearer {live.token()}"}, **kwargs)


def grant_site_role(live, site: str) -> list[str]:
    """The site's role, as Composer's registration makes it: User's permissions less those on all DAGs, and
    can_read, can_edit and can_delete on each DAG of the site's folder (its ids start ``<site>__``). Its DAG ids."""
    dag_ids = [dag["dag_id"] for dag in live.api("GET", "/dags", params={"dag_id_pattern": f"{site}__"}).json()["dags"]]
    template = fab(live, "GET", "/roles/User").json()["actions"]
    actions = [grant for grant in template if grant["resource"]["name"] != "DAGs"] + [
        {"action": {"name": action}, "resource": {"name": f"DAG:{dag_id}"}}
        for dag_id in dag_ids for action in ("can_read", "can_edit", "can_delete")]
    created = fab(live, "POST", "/roles", json={"name": site, "actions": actions})
    assert created.status_code == 200, created.text
    user = fab(live, "POST", "/users", json={
        "username": SITE_USER, "password": live.password, "email": f"{SITE_USER}@example.com",
        "first_name": "Team", "last_name": "A", "roles": [{"name": site}]})
    assert user.status_code == 200, user.text
    return dag_ids


def test_a_sites_role_triggers_clears_and_reads_its_own_sites_dags_and_gets_403_on_anothers(fab_airflow):
    own = grant_site_role(fab_airflow, "team-a")
    assert f"team-a__{DAG_NAME}" in own and not any(dag_id.startswith("team-b__") for dag_id in own)

    def as_user(user: str, dag_id: str) -> dict[str, int]:
        """The status of each of the three requests by ``user`` on ``dag_id``; a run of its own, or the admin's."""
        triggered = fab_airflow.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None}, user=user)
        run_id = (triggered.json() if triggered.ok else fab_airflow.api(
            "POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None}).json())["dag_run_id"]
        cleared = fab_airflow.api("POST", f"/dags/{dag_id}/clearTaskInstances", user=user,
                                  json={"dry_run": True, "dag_run_id": run_id, "only_failed": False})
        xcoms = fab_airflow.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/janitor/xcomEntries",
                                user=user)
        return {"trigger": triggered.status_code, "clear": cleared.status_code, "xcom": xcoms.status_code}

    from tests.live_airflow import USERNAME

    # The controls: the admin may on site B's DAG, so it is there; the site's user may on its own.
    assert as_user(USERNAME, f"team-b__{DAG_NAME}") == {"trigger": 200, "clear": 200, "xcom": 200}
    assert as_user(SITE_USER, f"team-a__{DAG_NAME}") == {"trigger": 200, "clear": 200, "xcom": 200}
    assert as_user(SITE_USER, f"team-b__{DAG_NAME}") == {"trigger": 403, "clear": 403, "xcom": 403}
    # What the site's user sees: its own site's DAGs alone.
    listed = fab_airflow.api("GET", "/dags", user=SITE_USER).json()["dags"]
    assert sorted(dag["dag_id"] for dag in listed) == sorted(own)
