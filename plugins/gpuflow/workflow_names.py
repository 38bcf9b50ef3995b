"""Names that the DAGs, their operators and the tools around them (the CLI, the demo's report, deploy-composer)
all read, kept where each of them can import them without climbing a layer or loading Airflow."""

from __future__ import annotations

#: The Airflow pool of the tasks that start GPU jobs (the GPU check, the launch, the Dataproc batch). With one slot
#: and deferred tasks counted, they start one at a time, and each re-checks the quota right before it starts, so
#: two runs cannot both pass the quota check and then exceed it. Create it once per Airflow (docs/gcp.md):
#: ``airflow pools set gpuflow_gpu 1 "gpuflow: GPU jobs start one at a time" --include-deferred``; on Composer,
#: deploy-composer creates it, and preflight fails a run when it is missing (preflight.pool_rules).
GPU_POOL = "gpuflow_gpu"

#: The task ids that other tasks and tools read results from: the preflight's rollout plan, the launch's job
#: handle, the smoke test's answers.
PREFLIGHT_TASK = "preflight"
LAUNCH_TASK = "launch"
SMOKE_TEST_TASK = "smoke_test"
