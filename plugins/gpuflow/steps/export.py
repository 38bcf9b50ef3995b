"""export_model: the model's bf16 state_dict, config and tokenizer into the run's bucket."""

from __future__ import annotations

import json
import logging
from typing import Any

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.platform import ExportBackend
from gpuflow.runs.naming import ResourceNames

log = logging.getLogger(__name__)

#: Written by beam_jobs/download_model.py beside the weights, last, once the export is whole.
EXPORT_MARKER = "gpuflow_export.json"


def existing_export(config: GpuflowConfig, names: ResourceNames, conn_id: str) -> dict[str, Any] | None:
    """The marker of a finished export at the run's model path, or None."""
    from airflow.providers.google.cloud.hooks.gcs import GCSHook

    gcs = GCSHook(**config.hook_identity(conn_id))
    bucket, _, folder = names.model_dir_uri.removeprefix("gs://").partition("/")
    marker_object, state_dict_object = f"{folder}/{EXPORT_MARKER}", f"{folder}/state_dict.pth"
    if not (gcs.exists(bucket, marker_object) and gcs.exists(bucket, state_dict_object)):
        return None
    marker: dict[str, Any] = json.loads(gcs.download(bucket, marker_object))
    return marker


def export_model(config: GpuflowConfig, names: ResourceNames, platform: ExportBackend) -> dict[str, Any]:
    """Export, unless the same model in bf16 already lies at the target path (a retry, or a re-run), or an earlier
    try's remote export still runs (then its handle comes back, and the task waits on it).

    A remote export is only started: the result's ``job`` is its handle, and the task defers until it ends."""
    result = {"state_dict_uri": names.state_dict_uri, "model_dir_uri": names.model_dir_uri, "model": config.model.name}
    marker = existing_export(config, names, platform.conn_id)
    needs_folder = config.inference.engine == "vllm"  # vLLM serves the save_pretrained folder, not the state_dict
    if marker and marker.get("model_name") == config.model.name and marker.get("dtype") == "bfloat16" \
            and (marker.get("save_pretrained") or not needs_folder):
        log.info("skipping the export: %s (bf16, %s bytes) is already at %s", config.model.name,
                 marker.get("state_dict_bytes"), names.state_dict_uri)
        return {**result, "skipped": True}
    job = platform.find_export(names)  # a retry waits on the export its earlier try started
    if job is not None:
        log.info("the export %s that an earlier try started still runs: waiting on it, not starting another", job.name)
        return {**result, "skipped": False, "job": job.to_xcom()}
    log.info("exporting %s as a bf16 state_dict to %s", config.model.name, names.state_dict_uri)
    job = platform.export_model(config.model.name, names)
    return {**result, "skipped": False, "job": job.to_xcom() if job else None}
