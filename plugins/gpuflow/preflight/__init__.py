"""Preflight: every rule is a function config -> findings, and every finding names its fix."""

from __future__ import annotations

from gpuflow.preflight.findings import Finding, PreflightFailed, format_findings, has_errors
from gpuflow.preflight.rules import CONFIG_RULES, ENVIRONMENT_RULES, run_preflight

__all__ = [
    "CONFIG_RULES",
    "ENVIRONMENT_RULES",
    "Finding",
    "PreflightFailed",
    "format_findings",
    "has_errors",
    "run_preflight",
]
