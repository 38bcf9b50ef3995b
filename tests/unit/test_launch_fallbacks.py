"""The launch step moves on to the next placement on an exhausted zone, and only then; the job that did not start
is stopped either way."""

from gpuflow.configuration.loading import load_config
from gpuflow.platform import JobHandle
from gpuflow.runs.naming import resource_names
from gpuflow.steps import launch as launch_step

EXHAUSTED = ("Startup of the worker pool in zone us-central1-a failed to bring up any of the desired 1 workers. "
             "ZONE_RESOURCE_POOL_EXHAUSTED: Instance 'x' creation failed: The zone 'projects/p/zones/us-central1-a' "
             "does not have enough resources available to fulfill the request.")


class RecordingPlatform:
    """The platform boundary: records what was started and stopped, by region."""

    log: list[tuple[str, str]] = []

    def __init__(self, config):
        self.config = config

    def launch_pipeline(self, argv, names, image, streaming=True, kind=""):
        self.log.append(("launch", self.config.region))
        return JobHandle(kind="dataflow", id=f"job-{len(self.log)}", name=names.job_name, location=self.config.region)

    def stop_pipeline(self, handle):
        self.log.append(("stop", handle.location))
        return True


def test_an_exhausted_zone_moves_on_to_the_next_fallback(monkeypatch):
    monkeypatch.setattr("gpuflow.platform.get_platform", RecordingPlatform)
    RecordingPlatform.log = []
    config = load_config(None, overrides=["gpu.fallbacks=[{region: us-east4}]"])
    names = resource_names(config, "gf-x")
    failures: list[str] = []
    first, handle = launch_step.start_next_placement(config, names, "img", 0, failures)
    assert (first.number, handle.location) == (1, "us-central1")
    assert launch_step.after_failed_start(config, first.number, handle, EXHAUSTED, failures) is True
    second, handle = launch_step.start_next_placement(config, names, "img", first.number, failures)
    assert (second.number, second.config.region, handle.location) == (2, "us-east4", "us-east4")
    assert RecordingPlatform.log == [("launch", "us-central1"), ("stop", "us-central1"), ("launch", "us-east4")]
    assert failures == ["attempt 1/2: 1 x nvidia-l4 on g2-standard-4 in us-central1: ZONE_RESOURCE_POOL_EXHAUSTED"]


def test_other_failures_are_not_retried_but_their_job_is_stopped(monkeypatch):
    monkeypatch.setattr("gpuflow.platform.get_platform", RecordingPlatform)
    RecordingPlatform.log = []
    config = load_config(None, overrides=["gpu.fallbacks=[{region: us-east4}]"])
    placement, handle = launch_step.start_next_placement(config, resource_names(config, "gf-x"), "img", 0, [])
    assert launch_step.after_failed_start(config, placement.number, handle, "SystemError: unknown opcode", []) is False
    assert RecordingPlatform.log == [("launch", "us-central1"), ("stop", "us-central1")]
