"""The launch step retries on exhausted zones with the configured fallbacks, and only then."""

import pytest

from gpuflow.config import load_config
from gpuflow.naming import resource_names
from gpuflow.platform import JobHandle
from gpuflow.steps import launch as launch_step

EXHAUSTED = ("Startup of the worker pool in zone us-central1-a failed to bring up any of the desired 1 workers. "
             "ZONE_RESOURCE_POOL_EXHAUSTED: Instance 'x' creation failed: The zone 'projects/p/zones/us-central1-a' "
             "does not have enough resources available to fulfill the request.")


class RecordingPlatform:
    """A platform boundary that fails the way Dataflow reports a stock-out, a given number of times."""

    def __init__(self, config, failures):
        self.config, self.failures, self.launched, self.stopped = config, failures, [], []

    def launch_pipeline(self, argv, names, image):
        self.launched.append(self.config.region)
        return JobHandle(kind="dataflow", id=f"job-{len(self.launched)}", name=names.job_name, location=self.config.region)

    def wait_until_running(self, handle):
        if self.failures:
            self.failures -= 1
            raise RuntimeError(EXHAUSTED)

    def stop_pipeline(self, handle):
        self.stopped.append(handle.id)
        return True


def test_an_exhausted_zone_moves_on_to_the_next_fallback(monkeypatch):
    config = load_config(None, overrides=["gpu.fallbacks=[{region: us-east4}]"])
    first = RecordingPlatform(config, failures=1)
    fallbacks = []
    monkeypatch.setattr("gpuflow.platform.get_platform", lambda c: fallbacks.append(RecordingPlatform(c, 0)) or fallbacks[-1])
    pushed = []
    handle = launch_step.launch(config, resource_names(config, "gf-x"), first, on_handle=pushed.append)
    assert first.launched == ["us-central1"] and first.stopped == ["job-1"]
    assert [p.config.region for p in fallbacks] == ["us-east4"] and handle.location == "us-east4"
    assert [h.id for h in pushed] == ["job-1", "job-1"]  # each attempt's handle reached XCom at once


def test_other_failures_are_not_retried(monkeypatch):
    config = load_config(None, overrides=["gpu.fallbacks=[{region: us-east4}]"])
    platform = RecordingPlatform(config, failures=0)
    platform.wait_until_running = lambda handle: (_ for _ in ()).throw(RuntimeError("SystemError: unknown opcode"))
    with pytest.raises(RuntimeError, match="unknown opcode"):
        launch_step.launch(config, resource_names(config, "gf-x"), platform)
    assert platform.stopped == ["job-1"]
