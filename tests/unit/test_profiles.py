"""The profiles' traits: the steps ask what the runner can do, and only two places pick by profile."""

import re

from gpuflow.configuration.loading import load_config
from gpuflow.configuration.profiles import PROFILES
from gpuflow.preflight.rules import CONFIG_RULES, ENVIRONMENT_RULES, PROFILE_RULES, WORKFLOW_CONFIG_RULES
from tests.helpers import ROOT

PICKS_BY_PROFILE = re.compile(r"\bprofile\s*(==|!=)")


def test_only_the_platform_and_preflights_rule_sets_pick_by_profile():
    found = []
    for path in sorted((ROOT / "plugins" / "gpuflow").rglob("*.py")) + sorted((ROOT / "dags").glob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("plugins/gpuflow/platform/"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PICKS_BY_PROFILE.search(line) and "PROFILE_RULES.items()" not in line:
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == [], "ask config.traits (gpuflow.configuration.profiles) instead:\n" + "\n".join(found)


def test_every_profile_has_every_trait_and_the_config_reads_its_own():
    assert set(PROFILES) == {"local", "gcp"}
    assert load_config(None).traits is PROFILES["local"]
    assert load_config("configs/gcp.example.yaml").traits is PROFILES["gcp"]


def test_each_profile_only_rule_is_in_a_rule_set():
    every = set(CONFIG_RULES).union(*WORKFLOW_CONFIG_RULES.values(), *ENVIRONMENT_RULES.values())
    for profile, rules in PROFILE_RULES.items():
        assert rules <= every, (profile, rules - every)
    assert not PROFILE_RULES["gcp"] & PROFILE_RULES["local"]
