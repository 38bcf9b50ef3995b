"""What the access preflight reads about a project, and the contract of the probe that reads it.

The platform layer implements the probe (``gpuflow.platform.gcp_access``); the rules that judge these facts
(``gpuflow.preflight.access_rules``) sit above it and import from here, never the other way round.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


class AccessUnknown(Exception):
    """A fact the probe could not read: ``why``, and ``command``, which would tell."""

    def __init__(self, why: str, command: str):
        super().__init__(why)
        self.why, self.command = why, command


@dataclass(frozen=True)
class EffectivePolicy:
    """A list constraint's effective policy, as far as gpuflow judges it."""

    allow_all: bool = False
    deny_all: bool = False
    allowed: tuple[str, ...] = ()
    denied: tuple[str, ...] = ()
    conditional: bool = False  # a rule with a condition: what it allows depends on tags gpuflow does not read


@dataclass(frozen=True)
class BucketFacts:
    location: str  # as Cloud Storage spells it: "US-CENTRAL1", "US", "EUR4"
    location_type: str  # "region", "dual-region" or "multi-region"


class AccessProbe(Protocol):
    """Reads a project's facts for these rules. Each method raises ``AccessUnknown`` when it cannot read them."""

    def caller(self) -> str | None: ...  # "serviceAccount:…" or "user:…", or None when not known
    def project_number(self) -> str: ...
    def disabled_services(self, services: list[str]) -> list[str]: ...
    def missing_project_permissions(self, permissions: list[str]) -> list[str]: ...
    def build_account(self) -> str | None: ...  # Cloud Build's default service account in the region
    def service_account_exists(self, email: str) -> bool: ...
    def missing_service_account_permissions(self, email: str, permissions: list[str]) -> list[str]: ...
    def project_roles(self, member: str) -> set[str]: ...
    def effective_policy(self, constraint: str) -> EffectivePolicy: ...
    def subnetwork_private_google_access(self, subnetwork: str) -> bool | None: ...  # None: no such subnetwork
    def first_contact(self, timeout_s: float = 10) -> str | None: ...  # why nothing can be read, or None
    def bucket(self, name: str) -> BucketFacts | None: ...
    def missing_bucket_permissions(self, name: str, permissions: list[str]) -> list[str]: ...
    def bucket_roles(self, name: str, member: str) -> set[str]: ...
    def repository_roles(self, repository: str, member: str) -> set[str]: ...  # Artifact Registry, in the region


def describe_policy(constraint: str, project: str) -> str:
    """The command that shows a constraint's effective policy on the project."""
    return f"gcloud org-policies describe {constraint.split('/', 1)[1]} --project={project} --effective"
