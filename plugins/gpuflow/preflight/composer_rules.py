"""What gpuflow's DAGs need from the Cloud Composer environment they run in, read through the provider's
``CloudComposerHook`` (``platform.composer_api.environment_facts``): an image at or above gpuflow's floor, and a
triggerer. Every gpuflow task that waits on a job defers, and Composer runs deferred tasks only "if you have at
least one triggerer instance" (docs.cloud.google.com/composer/docs/composer-3/use-deferrable-operators): without
one, a run would wait at its first deferral for ever. (The pool is ``pool_rules``'.)"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gpuflow.preflight.findings import Finding, error, unknown


def composer_findings(facts: dict[str, Any]) -> Iterator[Finding]:
    from gpuflow.composer.contents import image_too_old

    if facts.get("problem"):
        yield unknown("composer", f"could not read this Composer environment ({facts['problem']})",
                      "check that the connection's identity may read the environment (roles/composer.user)")
        return
    too_old = image_too_old(facts["image"])
    if too_old:
        problem, _, fix = too_old.partition(". Fix: ")
        yield error("composer", problem, fix)
    if facts["triggerers"] == 0:
        yield error("composer", "the environment has no Airflow triggerer, and every gpuflow task that waits on a "
                    "job defers: this run would wait at its first deferral for ever",
                    "gcloud composer environments update ENVIRONMENT --location LOCATION --triggerer-count 1 "
                    "(docs.cloud.google.com/composer/docs/composer-3/use-deferrable-operators)")
    elif facts["triggerers"] is None:
        yield unknown("composer", "the environment's description states no triggerer count",
                      "check in the console (Environment configuration > Workloads) that it runs a triggerer")
