"""Where the GPU workers may start: the configuration, then each of gpu.fallbacks that preflight accepts, in turn.

A failure moves on to the next placement only when ``gpuflow.gpus.troubleshoot`` diagnoses it as one another placement
can fix (an exhausted zone).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gpuflow.configuration.model import GpuflowConfig
from gpuflow.gpus.troubleshoot import classify

log = logging.getLogger(__name__)


def fallback_configs(config: GpuflowConfig) -> list[GpuflowConfig]:
    """The configured fallbacks as whole configurations, in order."""
    configs = []
    for fallback in config.gpu.fallbacks:
        candidate = config.model_copy(deep=True)
        if fallback.region:
            candidate.region = fallback.region
        if fallback.type:
            candidate.gpu.type = fallback.type
        if fallback.machine_type:
            candidate.gpu.machine_type = fallback.machine_type
        candidate.gpu.fallbacks = []
        configs.append(candidate)
    return configs


class FallbacksExhausted(RuntimeError):
    pass


@dataclass(frozen=True)
class Placement:
    """One place to start the GPU workers: the configuration itself (number 1) or one of its fallbacks."""

    number: int
    total: int
    config: GpuflowConfig

    @property
    def label(self) -> str:
        gpu = self.config.gpu
        return f"attempt {self.number}/{self.total}: {gpu.count} x {gpu.type} on {gpu.machine_type} in {self.config.region}"


def next_placement(config: GpuflowConfig, after: int, failures: list[str]) -> Placement:
    """The first placement after number ``after`` (0: start with the configuration itself) that preflight accepts.

    Every fallback is re-checked by preflight's configuration rules first; one with errors is skipped and noted in
    ``failures``. When none is left, FallbacksExhausted says what each attempt met."""
    from gpuflow.preflight import format_findings, has_errors, run_preflight

    candidates = [config, *fallback_configs(config)]
    for number in range(after + 1, len(candidates) + 1):
        placement = Placement(number, len(candidates), candidates[number - 1])
        if number > 1:
            findings = run_preflight(placement.config, check_environment=False)
            if has_errors(findings):
                log.warning("%s skipped, preflight refuses it:\n%s", placement.label, format_findings(findings))
                failures.append(f"{placement.label}: refused by preflight")
                continue
        log.info("%s", placement.label)
        return placement
    raise FallbacksExhausted(
        "no configuration could get GPUs: " + "; ".join(failures)
        + ". Fix: add gpu.fallbacks (other regions or GPU types) or try again later."
    )


def worth_a_fallback(placement: Placement, error_text: str, failures: list[str]) -> bool:
    """True when the failure is one another placement can fix (an exhausted zone); it is noted in ``failures``."""
    diagnosis = classify(error_text)
    if diagnosis is None or not diagnosis.try_fallback:
        return False
    log.warning("%s failed with %s: %s", placement.label, diagnosis.code, diagnosis.cause)
    failures.append(f"{placement.label}: {diagnosis.code}")
    return True
