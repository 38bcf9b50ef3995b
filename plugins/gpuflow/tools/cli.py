"""gpuflow: check a configuration and the environment before a run (preflight), print or check the launch a run
would send (launch-command), render and list the worker images (render-dockerfile, recipes, images), deploy into
Cloud Composer (deploy-composer), write a site's DAG file (site-dags), run the local emulators (emulators), and
debug a GPU VM (debug-vm). The DAGs themselves run in Airflow: see the README."""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from gpuflow.configuration.loading import load_config
from gpuflow.configuration.model import ConfigError, GpuflowConfig
from gpuflow.runs.naming import ResourceNames


def _add_config_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, help="YAML configuration (default: configs/local.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="dotted.key=value",
                        help="override one key; repeatable")


def cmd_preflight(args: argparse.Namespace) -> int:
    from gpuflow.preflight import format_findings, has_errors, run_preflight

    try:
        config = load_config(args.config, overrides=args.overrides)
    except ConfigError as error:
        if args.json:
            print(json.dumps({"ok": False, "config_error": str(error)}))
        else:
            print(str(error), file=sys.stderr)
        return 1
    workflow = args.workflow or ("dataproc" if config.dataproc is not None else "inference")
    zones_offering = access = None
    if args.access:  # gcp: ask Google, with the Airflow connection's identity, as the DAGs' preflight does
        from gpuflow.platform import get_platform

        platform = get_platform(config)
        zones_offering = platform.zones_offering
        access = platform.access_probe(args.impersonate)
        if access is None:
            print(f"preflight --access: the {config.profile} profile has no Google Cloud project to check",
                  file=sys.stderr)
        elif (unreachable := access.first_contact()) is not None:
            print(f"preflight --access: {unreachable}", file=sys.stderr)
            return 1
    findings = run_preflight(config, check_environment=not args.config_only, workflow=workflow,
                             zones_offering=zones_offering, access=access)
    # A check that could read nothing passes nothing: with --access, every row not read fails the command, unless
    # --accept-unknown says so explicitly.
    unread = [f for f in findings if f.level == "unknown"] if access is not None else []
    failed = has_errors(findings) or bool(unread and not args.accept_unknown)
    verdict = "FAILED" if has_errors(findings) else (
        f"not checked: {len(unread)} of {len(findings)}" + (" (accepted: --accept-unknown)" if args.accept_unknown
                                                            else "") if unread else "ok")
    if args.json:
        print(json.dumps({"ok": not failed, "not_checked": len(unread),
                          "findings": [f.model_dump() for f in findings]}, indent=2))
    else:
        print(format_findings(findings))
        print(f"preflight: {verdict}")
        if unread and not args.accept_unknown and not has_errors(findings):
            print("Fix: each unknown row says what could not be read and the command that reads it; grant that, or "
                  "accept the rows unchecked with --accept-unknown", file=sys.stderr)
    return 1 if failed else 0


def cmd_make_demo_model(args: argparse.Namespace) -> int:
    from gpuflow.platform.demo_model import write_demo_model

    write_demo_model(args.directory, seed=args.seed, architecture=args.architecture)
    print(f"demo model written to {args.directory}")
    return 0


def cmd_render_dockerfile(args: argparse.Namespace) -> int:
    from gpuflow.images.containers import check_dockerfile, render_recipe

    config = load_config(args.config, overrides=args.overrides)
    dockerfile = render_recipe(config, Path(args.output), args.recipe)
    problems = check_dockerfile(dockerfile, config)
    print(f"build context written to {args.output}")
    for problem in problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if problems else 0


def cmd_images(args: argparse.Namespace) -> int:
    """lock: resolve every lock for its image's platform and Python. check: resolve each lock as pip would inside the
    image (dry run) and check it against its recipe's label. Both reach only the package registry."""
    from gpuflow.images import locks as image_locks
    from gpuflow.images.containers import EXPORT_LOCK, export_image_target, lock_targets, recipe_metadata, recipe_names

    config = load_config(args.config, overrides=args.overrides)
    targets = lock_targets(config)
    if args.action == "lock":
        for name, (python, beam) in targets.items():
            print(f"{image_locks.compile_lock(name, python, beam)}: Python {python}" + (f", Beam {beam}" if beam else ""))
        return 0
    labels = {meta.lock: meta for meta in map(recipe_metadata, recipe_names())}
    failed = False
    for name in targets:
        lock = image_locks.read_lock(name)
        image_torch = export_image_target(config)[0] if name == EXPORT_LOCK else None
        label = labels.get(name)
        problems = image_locks.lock_problems(lock, label.cuda_major if label else None, image_torch,
                                             label.also_cuda if label else ())
        try:
            resolution = image_locks.resolve_lock(name)
            print(f"{name}: resolves for Python {resolution.python} on {image_locks.PLATFORM}: "
                  f"{len(resolution.would_install)} packages would install")
        except image_locks.LockError as error:
            problems.append(str(error))
        for problem in problems:
            print(f"  problem: {problem}", file=sys.stderr)
        failed |= bool(problems)
    return 1 if failed else 0


def cmd_debug_vm(args: argparse.Namespace) -> int:
    from gpuflow.gpus.debug_vm import debug_vm_commands
    from gpuflow.images.containers import render_recipe
    from gpuflow.steps.container import default_image

    config = load_config(args.config, overrides=args.overrides)
    if not config.uses_gpu:
        print("debug-vm: gpu.type is none (CPU workers), so there is no GPU to debug. Fix: set gpu.type (and "
              "gpu.machine_type) to the GPU the workers would use, e.g. --set gpu.type=nvidia-l4", file=sys.stderr)
        return 1
    image = config.container.image
    if not image:
        import tempfile

        from gpuflow.images.containers import context_digest

        with tempfile.TemporaryDirectory() as context:
            render_recipe(config, Path(context))
            image = default_image(config, context_digest(Path(context)))
    print(debug_vm_commands(config, image), end="")
    return 0


def cmd_emulators(args: argparse.Namespace) -> int:
    """start: run until interrupted; run -- CMD: start, run CMD with the emulator environment, stop."""
    from gpuflow.platform.emulators import running_emulators

    config = load_config(args.config, overrides=args.overrides)
    log_dir = Path(config.local.state_dir) / "emulators"
    with running_emulators(config, log_dir) as env:
        if args.action == "env":
            for key, value in env.items():
                if not key.startswith("AIRFLOW_CONN_"):
                    print(f"export {key}={value}")
            return 0
        if args.action == "run":
            command = [part for part in args.command if part != "--"]
            if not command:
                print("gpuflow emulators run -- COMMAND ...", file=sys.stderr)
                return 2
            return subprocess.call(command, env={**os.environ, **env})
        print(f"emulators running (logs in {log_dir}); Ctrl-C stops them", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from gpuflow.images.containers import recipe_table

    print(recipe_table())
    return 0


#: The DAG whose launch ``launch-command`` shows, unless --dag-id names another (the run's names derive from both).
STREAMING_DAG_ID = "llm_streaming_inference"


def _launch_plan(config: GpuflowConfig, run_id: str, scratch: Path,
                 dag_id: str = STREAMING_DAG_ID) -> tuple[ResourceNames, list[str], str, str]:
    """The resource names, pipeline arguments, image and job name of the streaming launch for this run."""
    from gpuflow.dataflow.options import job_name_for
    from gpuflow.runs.naming import resource_names, run_prefix
    from gpuflow.steps.container import image_for, render_context
    from gpuflow.steps.launch import pipeline_argv

    names = resource_names(config, run_prefix(dag_id, run_id))
    argv = pipeline_argv(config, names)
    image = config.container.image or (image_for(config, render_context(config, names, scratch))
                                        if config.traits.dataflow_workers else "")
    return names, argv, image, job_name_for(names, config, "llm-inference")


def launch_command_text(config: GpuflowConfig, run_id: str, dag_id: str = STREAMING_DAG_ID) -> str:
    """What the launch task runs for this configuration and run, as shell lines a person can run."""
    import shlex
    import tempfile

    with tempfile.TemporaryDirectory() as scratch:
        names, argv, image, job_name = _launch_plan(config, run_id, Path(scratch), dag_id)
    if not config.traits.dataflow_workers:
        from gpuflow.platform.local import LocalPlatform

        return "# the streaming pipeline on the local runner (emulators from `gpuflow emulators env`):\n" + \
            shlex.join(LocalPlatform(config).pipeline_command(argv)) + "\n"
    from gpuflow.dataflow.options import flex_launch, staging_command, template_uri_for

    if config.launch_mode == "flex_template":
        _, request = flex_launch(config, names, "llm_inference", argv, image, job_name, streaming=True)
        return "\n".join([
            f"# run {run_id!r} of {dag_id} (prefix {names.prefix}), image {shlex.quote(image)}",
            "# launch.mode flex_template: no command runs in Airflow. The launch task writes the template file",
            f"# {request.launch_parameter.container_spec_gcs_path} and sends this LaunchFlexTemplateRequest:",
            type(request).to_json(request, use_integers_for_enums=False),  # enums by name, as the REST API spells them
            "",
        ])
    return "\n".join([
        f"# run {run_id!r} of {dag_id} (prefix {names.prefix}), image {shlex.quote(image)}",
        "# 1. Beam's DataflowRunner writes the job request to GCS (drop --template_location to submit directly):",
        shlex.join(staging_command(config, names, "llm_inference.py", argv, image, job_name, streaming=True)),
        "# 2. start it (the launch task does this through the Dataflow Templates API):",
        shlex.join(["gcloud", "dataflow", "jobs", "run", job_name, f"--gcs-location={template_uri_for(names, job_name)}",
                    f"--region={config.region}", f"--project={config.project}"]),
        "",
    ])


def check_launch_request(config: GpuflowConfig, run_id: str, dag_id: str = STREAMING_DAG_ID) -> list[str]:
    """The streaming launch's request, read as Dataflow would receive it, against Dataflow's documented constraints:
    a Flex Template's launch request as built; a direct launch's job as Beam stages it into a local GCS emulator."""
    import tempfile

    from gpuflow.dataflow.constraints import violations
    from gpuflow.dataflow.options import flex_launch
    from gpuflow.dataflow.request import from_flex_launch
    from gpuflow.images.containers import image_cuda
    from gpuflow.platform.offline_staging import stage_offline

    cuda = image_cuda(config)
    with tempfile.TemporaryDirectory() as scratch:
        names, argv, image, job_name = _launch_plan(config, run_id, Path(scratch), dag_id)
    if config.launch_mode == "flex_template":
        _, request = flex_launch(config, names, "llm_inference", argv, image, job_name, streaming=True)
        view = from_flex_launch(request.launch_parameter, cuda)
    else:
        view = stage_offline(config, names, "llm_inference.py", argv, image, job_name, True, cuda)
    return [str(violation) for violation in violations(view)]


def cmd_launch_command(args: argparse.Namespace) -> int:
    from gpuflow.preflight import format_findings, run_preflight

    config = load_config(args.config, overrides=args.overrides)
    # Validated like preflight validates it: no command for a configuration that would not run.
    errors = [finding for finding in run_preflight(config, check_environment=False) if finding.level == "error"]
    if errors:
        print(format_findings(errors), file=sys.stderr)
        print("launch-command: the configuration has errors; fix them first (`gpuflow preflight`)", file=sys.stderr)
        return 1
    print(launch_command_text(config, args.run_id, args.dag_id), end="")
    if not args.check:
        return 0
    if not config.traits.dataflow_workers:
        print("# --check: the local profile sends nothing to Dataflow; nothing to check", file=sys.stderr)
        return 0
    broken = check_launch_request(config, args.run_id, args.dag_id)
    for problem in broken:
        print(f"request check: {problem}", file=sys.stderr)
    print(f"# request check: {'FAILED' if broken else 'ok'} (Dataflow's documented constraints, "
          "gpuflow.dataflow.constraints)", file=sys.stderr)
    return 1 if broken else 0


def cmd_deploy_composer(args: argparse.Namespace) -> int:
    from gpuflow.composer.api import ComposerTarget
    from gpuflow.tools.deploy_composer import ComposerDeployment, DeployFailed, DeployRefused

    target = ComposerTarget(args.environment, args.location, args.project, args.conn_id)
    try:
        ComposerDeployment(target).deploy(Path(args.config) if args.config else None, dry_run=args.dry_run)
    except DeployRefused as refused:
        print(f"deploy-composer: refused, nothing was changed: {refused}", file=sys.stderr)
        return 1
    except DeployFailed as failed:
        print(f"deploy-composer: failed: {failed}", file=sys.stderr)
        return 1
    return 0


def cmd_site_dags(args: argparse.Namespace) -> int:
    from gpuflow.sites import SiteNameError, site_name, write_site_dag_file

    config_file = Path(args.config)
    try:
        name = site_name(config_file)
        load_config(config_file)  # a file whose DAGs would fail to parse is refused here, with its problem
    except (SiteNameError, ConfigError) as error:
        print(f"site-dags: {error}", file=sys.stderr)
        return 1
    written = write_site_dag_file(config_file, Path(args.dags_folder))
    print(f"site {name}: {written} makes its DAGs ({name}__…) from {config_file.resolve()}; they replace the "
          f"repository's own local DAGs in {args.dags_folder}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuflow", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    preflight = commands.add_parser("preflight", help="validate a configuration and the environment")
    _add_config_args(preflight)
    preflight.add_argument("--json", action="store_true", help="machine-readable output")
    preflight.add_argument("--workflow", choices=["inference", "batch", "dataproc", "maintenance", "quota_report"],
                           default=None,
                           help="whose rules and needs to check: inference (streaming), batch, dataproc, maintenance "
                                "(teardown, janitor), quota_report (gpu_quota_report); default: dataproc when the "
                                "config has a dataproc section, else inference")
    preflight.add_argument("--access", action="store_true",
                           help="gcp: also ask Google whether the workflow's APIs are on, the Airflow connection's "
                                "identity holds their permissions, the workers' service account works, no "
                                "organization policy stops the workers, and the bucket is usable; a row it could not "
                                "read fails the command (not checked: N of M)")
    preflight.add_argument("--impersonate", nargs="+", metavar="ACCOUNT", default=None,
                           help="with --access: check as this service account (the last of a chain, each may act as "
                                "the next), e.g. the Composer environment's account, the identity the DAGs run as; "
                                "you need roles/iam.serviceAccountTokenCreator on it")
    preflight.add_argument("--accept-unknown", action="store_true",
                           help="with --access: pass although some rows could not be read (each says so)")
    preflight.add_argument("--config-only", action="store_true",
                           help="skip the environment checks (emulators, launch-environment versions)")
    preflight.set_defaults(func=cmd_preflight)

    demo = commands.add_parser("make-demo-model", help="write a small offline model (seq2seq T5, or causal)")
    demo.add_argument("directory", help="where to write the model (config, weights, tokenizer)")
    demo.add_argument("--seed", type=int, default=0, help="the weights' random seed (default: %(default)s)")
    demo.add_argument("--architecture", choices=("seq2seq", "causal"), default="seq2seq",
                      help="seq2seq: a small T5 (gpuflow-demo); causal: a small Llama-shaped model "
                           "(gpuflow-demo-causal); default: %(default)s")
    demo.set_defaults(func=cmd_make_demo_model)

    render = commands.add_parser("render-dockerfile", help="write a container build context")
    _add_config_args(render)
    render.add_argument("--recipe", default=None,
                        help="the recipe to render (`gpuflow recipes` lists them; default: the configuration's)")
    render.add_argument("--output", required=True, help="the folder to write the build context into")
    render.set_defaults(func=cmd_render_dockerfile)

    images = commands.add_parser("images", help="lock: write docker/locks/*.lock for their images (make lock); "
                                 "check: resolve each lock for its image, offline from Docker")
    _add_config_args(images)
    images.add_argument("action", choices=["lock", "check"],
                        help="lock: resolve docker/locks/*.in into their locks; check: install each lock dry-run")
    images.set_defaults(func=cmd_images)

    debug = commands.add_parser("debug-vm", help="print the guide's standalone GPU VM debugging commands")
    _add_config_args(debug)
    debug.set_defaults(func=cmd_debug_vm)

    recipes = commands.add_parser("recipes", help="list the container recipes: each lock's Python, torch, "
                                  "transformers, CUDA line, driver need and Beam versions")
    recipes.set_defaults(func=cmd_recipes)

    launch = commands.add_parser("launch-command", help="print the exact command line the launch task runs")
    _add_config_args(launch)
    launch.add_argument("--run-id", default="manual", help="the DAG run id the resource names derive from")
    launch.add_argument("--dag-id", default=STREAMING_DAG_ID,
                        help="the DAG of that run (the names derive from both; default: %(default)s)")
    launch.add_argument("--check", action="store_true",
                        help="gcp: read the request Dataflow would receive (a direct launch is staged by Beam into a "
                             "local GCS emulator; nothing is sent to Google) and check it against Dataflow's "
                             "documented constraints")
    launch.set_defaults(func=cmd_launch_command)

    deploy = commands.add_parser("deploy-composer", help="copy gpuflow into a Cloud Composer environment")
    deploy.add_argument("--environment", required=True, help="the Composer environment's name")
    deploy.add_argument("--location", required=True, help="its region, e.g. europe-west4")
    deploy.add_argument("--project", default=None, help="its project (default: the connection's)")
    deploy.add_argument("--conn-id", default="google_cloud_default",
                        help="the Airflow connection whose identity deploys (default: google_cloud_default; it must "
                             "be defined: AIRFLOW_CONN_GOOGLE_CLOUD_DEFAULT='{\"conn_type\": "
                             "\"google_cloud_platform\"}' uses your Application Default Credentials)")
    deploy.add_argument("--config", default=None,
                        help="your gcp configuration: it becomes a site, data/site/<name>.yaml, with its own DAGs "
                             "(dags/<name>/gpuflow_site.py: <name>__…); a later deploy without --config leaves it "
                             "as it is")
    deploy.add_argument("--dry-run", action="store_true",
                        help="read the environment and print what would change; change nothing")
    deploy.set_defaults(func=cmd_deploy_composer)

    sites = commands.add_parser("site-dags", help="write a site's DAG file (dags/<site>/gpuflow_site.py): the DAGs "
                                "of one configuration file, for an Airflow you run yourself")
    sites.add_argument("--config", required=True, help="the site's configuration file; its stem names the site")
    sites.add_argument("--dags-folder", required=True,
                       help="the Airflow DAG folder ([core] dags_folder); its site folders replace the repository's "
                            "own local DAGs there")
    sites.set_defaults(func=cmd_site_dags)

    emulators = commands.add_parser("emulators", help="start the local profile's emulators")
    _add_config_args(emulators)
    emulators.add_argument("action", choices=["start", "run", "env"],
                           help="start: run them until Ctrl-C; run -- COMMAND: start them, run COMMAND with their "
                                "environment, stop them; env: print that environment as export lines")
    emulators.add_argument("command", nargs=argparse.REMAINDER, help="with run: -- then the command")
    emulators.set_defaults(func=cmd_emulators)
    return parser


def setup_problem(error: Exception) -> str | None:
    """A user's setup mistake that reached the command as an exception, said in one line with the command that
    fixes it; None for anything else (a bug, which keeps its traceback)."""
    import re

    from airflow.exceptions import AirflowNotFoundException  # type: ignore[attr-defined]  # (where 3.1 has it too)
    from google.auth.exceptions import DefaultCredentialsError

    if isinstance(error, AirflowNotFoundException):
        found = re.search(r"conn_id `([^`]+)`", str(error))
        conn_id = found.group(1) if found else "google_cloud_default"
        return (f"the Airflow connection {conn_id!r} is not defined here (gcp_conn_id names it), neither in this "
                "shell's environment nor in the database of this shell's AIRFLOW_HOME. Fix: "
                f"export AIRFLOW_CONN_{conn_id.upper()}='{{\"conn_type\": \"google_cloud_platform\"}}' (it then "
                f"uses your Application Default Credentials), or `airflow connections add {conn_id} --conn-type "
                "google_cloud_platform` with the same AIRFLOW_HOME; on Cloud Composer it exists already")
    if isinstance(error, DefaultCredentialsError):
        return ("no Google Cloud credentials were found (Application Default Credentials). Fix: "
                "`gcloud auth application-default login` as yourself, or point GOOGLE_APPLICATION_CREDENTIALS (or the "
                "connection's key_path) at a service account's key (docs/gcp.md)")
    return google_problem(error)


def google_problem(error: Exception) -> str | None:
    """A Google API's refusal or silence, said in one line with the fix; None for anything else. The message's first
    line is Google's own (it names the resource); gRPC's details and the traceback add nothing a user can act on."""
    from google.api_core import exceptions as google
    from google.auth.exceptions import TransportError

    said = (str(error).splitlines() or [type(error).__name__])[0][:300]
    if isinstance(error, google.NotFound):
        return (f"Google answered Not Found: {said}. Fix: check the names given (the project id, the location, the "
                "environment or resource name): `gcloud composer environments list --locations=LOCATION "
                "--project=PROJECT` lists a project's environments")
    if isinstance(error, google.PermissionDenied | google.Forbidden | google.Unauthenticated):
        return (f"Google refused the call: {said}. Fix: the project may not exist, or you (or the connection's "
                "account) may lack access to it: check the project id with `gcloud projects describe PROJECT`, and "
                "the roles docs/gcp.md lists")
    unreachable = (google.ServiceUnavailable, google.DeadlineExceeded, google.RetryError, TransportError,
                   ConnectionError, TimeoutError)
    if isinstance(error, unreachable) or type(error).__module__.startswith("requests"):
        return (f"Google could not be reached ({type(error).__name__}: {said}). Fix: check this machine's network "
                "(DNS, proxy, firewall) and try again; `gcloud auth print-access-token` shows whether Google answers")
    return None


def _connection_from_airflow_db(error: Exception) -> bool:
    """A connection this command could not find that Airflow's database holds (``airflow connections add``, the fix
    the message names): Airflow 3 hooks outside a task read only environment variables and secrets backends, so this
    shell command exports it as AIRFLOW_CONN_<ID> for itself. True when it did."""
    import os
    import re

    from airflow.exceptions import AirflowNotFoundException  # type: ignore[attr-defined]  # (where 3.1 has it too)

    found = re.search(r"conn_id `([^`]+)`", str(error)) if isinstance(error, AirflowNotFoundException) else None
    variable = f"AIRFLOW_CONN_{found.group(1).upper()}" if found else ""
    if not found or variable in os.environ:
        return False
    try:
        from airflow.models.connection import Connection

        stored = Connection.get_connection_from_secrets(found.group(1))  # the metastore among the backends
    except Exception:  # no database here, or not in it: the message says how to define it
        return False
    os.environ[variable] = stored.as_json()
    return True


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for chatty in ("airflow.configuration", "airflow.settings"):  # "Reading the config from …" at every command
        logging.getLogger(chatty).setLevel(logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        try:
            return int(args.func(args))
        except Exception as error:
            if not _connection_from_airflow_db(error):
                raise
            return int(args.func(args))  # once more, now that the connection is found
    except ConfigError as error:
        print(str(error), file=sys.stderr)
        return 1
    except Exception as error:
        problem = setup_problem(error)
        if problem is None:
            raise
        print(problem, file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
