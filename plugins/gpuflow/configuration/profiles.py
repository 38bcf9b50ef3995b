"""What each profile's runner can and cannot do: the differences the steps act on, each said once with its reason.

The steps, operators and triggers ask these traits (``config.traits``), never which profile they run on; the
platform (``gpuflow.platform.get_platform``) and preflight's rule sets (``gpuflow.preflight.rules``) are the two
places that pick by profile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class ProfileTraits:
    #: A streaming job can drain (finish what it holds, then stop). Dataflow drains; the local DirectRunner
    #: acknowledges prompts as it pulls them and cannot, so each local job reads a subscription of its own.
    drains: bool
    #: A running streaming job can be replaced in place (Dataflow's update, ``--update``); the DirectRunner cannot.
    updates_in_place: bool
    #: How a lasting job learns of a new model version: Beam's WatchFilePattern side input on Dataflow
    #: ("side_input"); the DirectRunner cannot run it, so the local handler polls the pointer folder ("poll").
    model_refresh: Literal["side_input", "poll"]
    #: The RunInference step carries the accelerator resource hint (Dataflow's right fitting); the DirectRunner
    #: ignores hints, so none is sent there.
    resource_hints: bool
    #: Compute Engine's GPU quota bounds what a job may start (checked again right before each start); the local
    #: profile has this machine's GPUs only.
    gpu_quota: bool
    #: A worker without a working GPU bills for the GPU it cannot use, so a GPU check that finds none always fails.
    gpus_billed: bool
    #: The job's GPU usage comes from Cloud Monitoring and decides ``smoke_test.gpu_usage``; nvidia-smi's reading of
    #: this machine is reported only.
    gpu_usage_judged: bool
    #: The workers are Dataflow's: Google's machines with the driver Dataflow installs, one SDK process per vCPU by
    #: default, and a Flex Template that launches from the worker image itself. Local: this machine's DirectRunner.
    dataflow_workers: bool
    #: Spark batches run on Dataproc Serverless; the local profile runs the same PySpark file on local Spark.
    managed_spark: bool
    #: gs:// paths are the local GCS emulator's (the triggerer reaches it by its address, not its environment).
    storage_emulator: bool


PROFILES: dict[str, ProfileTraits] = {
    "local": ProfileTraits(drains=False, updates_in_place=False, model_refresh="poll", resource_hints=False,
                           gpu_quota=False, gpus_billed=False, gpu_usage_judged=False, dataflow_workers=False,
                           managed_spark=False, storage_emulator=True),
    "gcp": ProfileTraits(drains=True, updates_in_place=True, model_refresh="side_input", resource_hints=True,
                         gpu_quota=True, gpus_billed=True, gpu_usage_judged=True, dataflow_workers=True,
                         managed_spark=True, storage_emulator=False),
}
