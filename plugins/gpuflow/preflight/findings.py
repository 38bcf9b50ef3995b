"""What a preflight rule reports."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel


class Finding(BaseModel):
    level: Literal["error", "warning", "unknown", "info"]
    field: str
    problem: str
    fix: str


def error(field: str, problem: str, fix: str) -> Finding:
    return Finding(level="error", field=field, problem=problem, fix=fix)


def warning(field: str, problem: str, fix: str) -> Finding:
    return Finding(level="warning", field=field, problem=problem, fix=fix)


def unknown(field: str, problem: str, fix: str) -> Finding:
    """Not read, so neither passed nor failed: why, and (``fix``) the command that would tell. Never an error."""
    return Finding(level="unknown", field=field, problem=problem, fix=fix)


def info(field: str, problem: str, fix: str) -> Finding:
    """Not a problem: what gpuflow decided, and why (the ``fix`` says what it does)."""
    return Finding(level="info", field=field, problem=problem, fix=fix)


class PreflightFailed(RuntimeError):
    def __init__(self, findings: list[Finding]):
        self.findings = findings
        super().__init__("preflight found errors; nothing was created.\n" + format_findings(findings))


def has_errors(findings: Iterable[Finding]) -> bool:
    return any(finding.level == "error" for finding in findings)


def format_findings(findings: list[Finding]) -> str:
    """A plain-text table: level, field, problem, fix."""
    if not findings:
        return "preflight: no findings"
    rows = [("LEVEL", "FIELD", "PROBLEM", "FIX")] + [(f.level, f.field, f.problem, f.fix) for f in findings]
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + "  " + row[3] for row in rows
    )
