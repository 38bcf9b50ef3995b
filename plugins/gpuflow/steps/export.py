"""export_model: the model's bf16 state_dict, config and tokenizer into the run's bucket."""

from __future__ import annotations

import logging
from typing import Any

from gpuflow.config import GpuflowConfig
from gpuflow.naming import ResourceNames
from gpuflow.platform import Platform

log = logging.getLogger(__name__)


def export_model(config: GpuflowConfig, names: ResourceNames, platform: Platform) -> dict[str, Any]:
    log.info("exporting %s as a bf16 state_dict to %s", config.model.name, names.state_dict_uri)
    state_dict_uri = platform.export_model(config.model.name, names)
    return {"state_dict_uri": state_dict_uri, "model_dir_uri": names.model_dir_uri, "model": config.model.name}
