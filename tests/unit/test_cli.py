import json
import re
import subprocess
import sys

import pytest

from gpuflow.tools.cli import main


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "gpuflow.tools.cli", *args], capture_output=True, text=True)


def test_preflight_rejects_a_bad_configuration_naming_the_field():
    result = run_cli("preflight", "--config-only", "--set", "worker.disk_size_gb=20")
    assert result.returncode == 1
    assert "worker.disk_size_gb" in result.stdout and "50 or more" in result.stdout


def test_preflight_rejects_an_invalid_value_before_rules_run():
    result = run_cli("preflight", "--config", "configs/local.yaml", "--set", "gpu.count=0")
    assert result.returncode == 1
    assert "gpu.count" in result.stderr


def test_preflight_json_output(capsys):
    assert main(["preflight", "--config-only", "--json", "--set", "gpu.machine_type=n1-standard-8"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False
    assert report["findings"][0]["field"] == "gpu.machine_type"


def test_preflight_of_the_default_config_passes_its_config_rules(capsys):
    assert main(["preflight", "--config-only"]) == 0
    assert "preflight: ok" in capsys.readouterr().out


def test_make_demo_model_writes_a_loadable_model(tmp_path):
    assert main(["make-demo-model", str(tmp_path / "m")]) == 0
    from transformers import AutoConfig, AutoTokenizer

    assert AutoConfig.from_pretrained(tmp_path / "m").model_type == "t5"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "m")
    assert tokenizer.pad_token_id == 0 and tokenizer.eos_token_id == 1


def test_make_demo_model_writes_a_causal_model_on_request(tmp_path):
    assert main(["make-demo-model", str(tmp_path / "c"), "--architecture", "causal"]) == 0
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tmp_path / "c").model_type == "llama"


def test_render_dockerfile(tmp_path):
    assert main(["render-dockerfile", "--output", str(tmp_path)]) == 0
    assert (tmp_path / "Dockerfile").exists()
    with pytest.raises(SystemExit):
        main(["render-dockerfile"])


def test_dataproc_example_passes_and_six_l4_cores_fail():
    assert run_cli("preflight", "--config", "configs/dataproc.example.yaml").returncode == 0
    result = run_cli("preflight", "--config", "configs/dataproc.example.yaml", "--set", "dataproc.executor_cores=6")
    assert result.returncode == 1
    assert "dataproc.executor_cores" in result.stdout and "4 (the default), 8, 12 or 16" in result.stdout


def test_launch_command_is_exactly_what_the_launch_task_runs(capsys, monkeypatch):
    import shlex

    from gpuflow.configuration.loading import load_config
    from gpuflow.platform import gcp as gcp_platform
    from gpuflow.runs.naming import resource_names, run_prefix
    from gpuflow.steps.launch import pipeline_argv
    from tests.gcp_fakes import FakeGoogleCloud

    overrides = ["project=acme-ml-prod", "gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-standard-8",
                 "model.dtype=float32", "launch.mode=direct"]
    assert main(["launch-command", "--config", "configs/gcp.example.yaml", "--run-id", "manual__1",
                 *(item for o in overrides for item in ("--set", o))]) == 0
    printed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    staging, start = (shlex.split(line) for line in printed)
    assert "--dataflow_service_options=worker_accelerator=type:nvidia-tesla-t4;count:1;install-nvidia-driver" in staging
    assert "--machine_type=n1-standard-8" in staging and "--experiments=use_runner_v2" in staging
    assert start[:4] == ["gcloud", "dataflow", "jobs", "run"]

    # The launch task, for the same configuration, run and image, stages with the very same command.
    config = load_config("configs/gcp.example.yaml", overrides=overrides)
    names = resource_names(config, run_prefix("llm_streaming_inference", "manual__1"))
    image = next(a.split("=", 1)[1] for a in staging if a.startswith("--sdk_container_image="))
    ran = []

    def record(cmd, log, **kwargs):  # the Beam provider's subprocess runner, under BeamHook
        ran.append(cmd)
        raise RuntimeError("stop here: nothing is staged in a unit test")

    monkeypatch.setattr("airflow.providers.apache.beam.hooks.beam.run_beam_command", record)
    FakeGoogleCloud().install(monkeypatch)
    platform = gcp_platform.GcpPlatform(config)
    with pytest.raises(RuntimeError, match="stop here"):
        platform.launch_pipeline(pipeline_argv(config, names), names, image)
    assert ran == [staging]


def test_the_staging_acts_as_the_connections_impersonated_account(monkeypatch):
    from gpuflow.configuration.loading import load_config
    from gpuflow.platform.gcp import GcpPlatform
    from gpuflow.runs.naming import resource_names
    from gpuflow.steps.launch import pipeline_argv
    from tests.gcp_fakes import FakeGoogleCloud

    ran = []

    def record(cmd, log, **kwargs):
        ran.append(cmd)
        raise RuntimeError("stop here")

    monkeypatch.setattr("airflow.providers.apache.beam.hooks.beam.run_beam_command", record)
    import json

    chain = "deployer@acme-ml-prod.iam.gserviceaccount.com,gpuflow@acme-ml-prod.iam.gserviceaccount.com"
    monkeypatch.setenv("AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT", json.dumps({  # the connection's chain, as a user sets it
        "conn_type": "google_cloud_platform", "extra": {"is_anonymous": True, "impersonation_chain": chain}}))
    FakeGoogleCloud().install(monkeypatch)
    config = load_config("configs/gcp.example.yaml", overrides=["project=acme-ml-prod", "launch.mode=direct"])
    names = resource_names(config, "gf-0123456789")
    with pytest.raises(RuntimeError, match="stop here"):
        GcpPlatform(config).launch_pipeline(pipeline_argv(config, names), names, "img:1")
    assert ("--impersonate_service_account=deployer@acme-ml-prod.iam.gserviceaccount.com,"
            "gpuflow@acme-ml-prod.iam.gserviceaccount.com") in ran[0]


@pytest.mark.parametrize(("overrides", "field"), [
    ([], "project"),                                                   # the example's placeholder project
    (["project=acme-ml-prod", "gpu.zone=europe-west4-a"], "gpu.zone"),  # a zone outside the region
])
def test_launch_command_validates_the_configuration_first(overrides, field, capsys):
    assert main(["launch-command", "--config", "configs/gcp.example.yaml",
                 *(item for o in overrides for item in ("--set", o))]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and field in captured.err and "gpuflow preflight" in captured.err


def test_debug_vm_prints_the_workers_accelerator_and_refuses_cpu_workers(capsys):
    assert main(["debug-vm", "--config", "configs/gcp.example.yaml", "--set", "container.image=us-docker.pkg.dev/p/r/i:1"]) == 0
    assert "--accelerator=type=nvidia-l4,count=1" in capsys.readouterr().out
    assert main(["debug-vm", "--config", "configs/gcp.example.yaml", "--set", "gpu.type=none",
                 "--set", "gpu.machine_type=n2-highmem-2"]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and "no GPU to debug" in captured.err and "gpu.type=nvidia-l4" in captured.err


def test_debug_vm_quotes_every_value_it_prints():
    """A value holding shell syntax stays one argument of the line a person pastes: no second command."""
    import shlex

    from gpuflow.configuration.loading import load_config
    from gpuflow.gpus.debug_vm import debug_vm_commands

    config = load_config("configs/gcp.example.yaml", overrides=["gpu.machine_type=g2-standard-8;touch /tmp/owned"])
    text = debug_vm_commands(config, "us-docker.pkg.dev/p/r/i:1 $(id)", vm_name="vm;reboot")
    create = " ".join(line.rstrip("\\").strip() for line in text.split("gcloud compute instances create", 1)[1]
                      .split("\n\n", 1)[0].splitlines())
    words = shlex.split("gcloud compute instances create " + create, comments=True)
    assert "--machine-type=g2-standard-8;touch /tmp/owned" in words and "vm;reboot" in words
    assert "'us-docker.pkg.dev/p/r/i:1 $(id)'" in text and "\n    us-docker.pkg.dev/p/r/i:1 $(id)" not in text


def test_every_command_and_option_says_what_it_does_and_none_rewrites_the_docs():
    import argparse

    from gpuflow.tools.cli import build_parser

    (subcommands,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    silent = [(name, action.dest) for name, parser in subcommands.choices.items() for action in parser._actions
              if not isinstance(action, argparse._HelpAction) and not action.help]
    assert silent == []
    assert all(choice.help for choice in subcommands._choices_actions)
    assert {"config-reference", "params-schema"}.isdisjoint(subcommands.choices)  # `make generate` does that


# -- a user's setup mistakes: one message with the fix, never a traceback ------------------------------------------


def run_as_a_user(tmp_path, *args, cwd=None, **env):
    """The installed command, in a shell with no Airflow connection and no Google credentials (unless ``env`` gives
    them), from ``cwd``."""
    import os
    from pathlib import Path

    clean = {key: value for key, value in os.environ.items()
             if not key.startswith("AIRFLOW_CONN_") and key != "GOOGLE_APPLICATION_CREDENTIALS"}
    clean.update(HOME=str(tmp_path), NO_GCE_CHECK="True", GCE_METADATA_HOST="127.0.0.1:9",
                 GCE_METADATA_IP="127.0.0.1:9", **env)
    command = Path(sys.executable).with_name("gpuflow")
    return subprocess.run([str(command), *args], capture_output=True, text=True, env=clean, cwd=cwd or tmp_path,
                          timeout=120)


GCP_EXAMPLE = str(__import__("tests.helpers", fromlist=["ROOT"]).ROOT / "configs" / "gcp.example.yaml")
ANONYMOUS_CONNECTION = '{"conn_type": "google_cloud_platform"}'


@pytest.mark.parametrize(("args", "env", "says"), [
    (["preflight", "--access", "--config", GCP_EXAMPLE], {},
     "AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT='{\"conn_type\": \"google_cloud_platform\"}'"),
    (["preflight", "--access", "--config", GCP_EXAMPLE],
     {"AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT": ANONYMOUS_CONNECTION}, "gcloud auth application-default login"),
    (["deploy-composer", "--environment", "e", "--location", "us-central1", "--dry-run"], {},
     "the Airflow connection 'google_cloud_default' is not defined"),
], ids=["no-connection", "no-credentials", "deploy-without-connection"])
def test_a_missing_connection_or_credentials_is_one_message_with_the_fix(tmp_path, args, env, says):
    ran = run_as_a_user(tmp_path, *args, **env)
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert says in ran.stderr and "Fix:" in ran.stderr
    assert "Reading the config from" not in ran.stderr


def test_an_invalid_or_relative_config_file_is_read_as_a_user_means_it(tmp_path):
    (tmp_path / "mine.yaml").write_text("profile: gcp\nmodel:\n  name: [unclosed\n")
    ran = run_as_a_user(tmp_path, "preflight", "--config-only", "--config", "mine.yaml")
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    # resolved against the current directory, named with its line, its text not echoed
    assert "config file mine.yaml is not valid YAML at line 4, column 1" in ran.stderr  # (only here, in cwd)
    assert "[unclosed" not in ran.stderr + ran.stdout


def test_preflight_offers_every_workflow_the_access_check_and_the_docs_name():
    from gpuflow.preflight.access_rules import WORKFLOW_NEEDS
    from gpuflow.preflight.rules import ENVIRONMENT_RULES, WORKFLOW_CONFIG_RULES
    from gpuflow.tools.cli import build_parser

    preflight = build_parser()._subparsers._group_actions[0].choices["preflight"]
    (workflow,) = [action for action in preflight._actions if action.dest == "workflow"]
    assert set(workflow.choices) == set(WORKFLOW_NEEDS) == set(WORKFLOW_CONFIG_RULES) == set(ENVIRONMENT_RULES)
    assert main(["preflight", "--config", GCP_EXAMPLE, "--set", "project=acme-ml-prod", "--workflow",
                 "quota_report", "--config-only"]) == 0


def test_preflight_access_with_google_unreachable_fails_within_seconds_as_not_checked(tmp_path):
    """This machine reaches no network: with credentials (anonymous, at once) and a connection, the check's first
    read fails without retries, and the command says so at once instead of retrying for minutes."""
    import os
    import time

    from tests.helpers import ROOT

    started = time.monotonic()
    ran = run_as_a_user(tmp_path, "preflight", "--access", "--config-only", "--config", GCP_EXAMPLE,
                        "--set", "project=acme-ml-prod", AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT=ANONYMOUS_CONNECTION,
                        PYTHONPATH=os.pathsep.join([str(ROOT / "tests" / "anonymous_adc"),
                                                    os.environ.get("PYTHONPATH", "")]))
    took = time.monotonic() - started
    assert ran.returncode == 1 and "Traceback" not in ran.stderr, ran.stderr[-3000:]
    assert "Google could not be reached" in ran.stderr and "nothing could be checked" in ran.stderr
    assert "preflight: ok" not in ran.stdout
    assert took < 10 + 5, took  # 10 s for the read at most, and the command's own start


def test_the_missing_connection_fix_works_as_the_message_words_it(tmp_path, migrated_sqlite):
    """As a user would: the message says `airflow connections add …`; after it, in the same AIRFLOW_HOME (its
    database migrated, as `airflow db migrate` makes it), the check gets past the connection (to the next step, the
    credentials) instead of repeating itself."""
    import shutil
    from pathlib import Path

    home = {"AIRFLOW_HOME": str(tmp_path / "airflow")}
    before = run_as_a_user(tmp_path, "preflight", "--access", "--config-only", "--config", GCP_EXAMPLE, **home)
    assert "the Airflow connection 'google_cloud_default' is not defined" in before.stderr, before.stderr[-2000:]
    fix = re.search(r"`(airflow connections add [^`]+)`", before.stderr).group(1)
    (tmp_path / "airflow").mkdir(exist_ok=True)
    shutil.copyfile(migrated_sqlite, tmp_path / "airflow" / "airflow.db")
    airflow = str(Path(sys.executable).with_name("airflow"))
    done = subprocess.run([airflow, *fix.split()[1:]], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**{k: v for k, v in __import__("os").environ.items()
                                  if not k.startswith("AIRFLOW_CONN_")}, **home})
    assert done.returncode == 0, done.stderr[-2000:]
    after = run_as_a_user(tmp_path, "preflight", "--access", "--config-only", "--config", GCP_EXAMPLE, **home)
    assert after.returncode == 1 and "Traceback" not in after.stderr, after.stderr[-2000:]
    assert "is not defined" not in after.stderr
    assert "gcloud auth application-default login" in after.stderr  # the next step a user takes


def test_launch_command_on_the_flex_template_default_prints_the_request_with_enums_by_name(capsys):
    assert main(["launch-command", "--config", "configs/gcp.example.yaml", "--set", "project=acme-ml-prod"]) == 0
    out = capsys.readouterr().out
    request = json.loads(out[out.index("{"):out.rindex("}") + 1])
    assert request["launchParameter"]["environment"]["ipConfiguration"] == "WORKER_IP_PUBLIC"
    assert "LaunchFlexTemplateRequest" in out
