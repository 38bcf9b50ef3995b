"""Each GPU readiness rule: it fires on the case the guides describe, names the field and the fix,
and the finding disappears when the rule is taken out of the rule list."""
import datetime

import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.preflight import rules as rules_module
from gpuflow.preflight import run_preflight
from gpuflow.preflight.gpu_rules import GPU_RULES


def findings(*overrides, config_file=None):
    return run_preflight(load_config(config_file, overrides=list(overrides)), check_environment=False)


CASES = [
    # (overrides, rule name, field, level, words in the fix)
    (["gpu.type=nvidia-rtx-9999"], "gpu_type_known", "gpu.type", "error", "nvidia-l4"),
    (["gpu.machine_type=n1-standard-8"], "machine_type_fits_gpu", "gpu.machine_type", "error", "g2-standard-4"),
    (["gpu.type=nvidia-tesla-a100", "gpu.machine_type=g2-standard-8"], "machine_type_fits_gpu", "gpu.machine_type",
     "error", "a2-highgpu-1g"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=g2-standard-4"], "machine_type_fits_gpu", "gpu.machine_type",
     "error", "N1 machine type"),
    (["gpu.machine_type=g2-standard-24"], "machine_type_fits_gpu", "gpu.count", "error", "gpu.count: 2"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-standard-8", "gpu.count=3", "model.dtype=float32"],
     "machine_type_fits_gpu", "gpu.count", "error", "[1, 2, 4]"),
    (["dataflow_service_options=['worker_accelerator=count:1;type:nvidia-l4;install-nvidia-driver']"],
     "service_options_well_formed", "dataflow_service_options", "error",
     "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver"),
    (["dataflow_service_options=['worker_accelerator=type:nvidia-l4;count:1']"], "service_options_well_formed",
     "dataflow_service_options", "error", "install-nvidia-driver"),
    (["dataflow_service_options=['worker_accelerator=type:nvidia-tesla-t4;count:1;install-nvidia-driver']"],
     "service_options_well_formed", "dataflow_service_options", "error", "gpu.* is the one place"),
    (["beam_version=2.45.0", "container.recipe=beam_sdk_cuda"], "beam_version_for_gpu", "beam_version", "error",
     "2.50.0"),
    (["beam_version=2.47.0", "container.recipe=beam_sdk_cuda"], "beam_version_for_gpu", "beam_version", "warning",
     "2.50.0"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-standard-8", "model.dtype=bfloat16"], "dtype_for_gpu",
     "model.dtype", "error", "float32"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-standard-8"], "dtype_for_gpu", "model.dtype", "warning",
     "nvidia-l4"),
    (["model.name=google/flan-ul2"], "model_memory_fits", "gpu.type", "error", "nvidia-a100-80gb"),
    (["model.name=google/flan-t5-xxl", "gpu.type=nvidia-tesla-a100", "gpu.machine_type=a2-highgpu-1g",
      "profile=gcp", "project=acme-ml-prod"],
     "gpu_request_and_sharing",
     "gpu.sharing", "info", "no_use_multiple_sdk_containers"),
    (["model.name=google/flan-t5-xl", "gpu.machine_type=g2-standard-8", "gpu.sharing=mps"], "gpu_request_and_sharing",
     "gpu.sharing", "error", "gpu.model_copies: 3"),
    # gpu.request and gpu.sharing
    (["dataflow.experiments=[no_use_multiple_sdk_containers]", "gpu.sharing=mps", "gpu.machine_type=g2-standard-8"],
     "gpu_request_and_sharing", "gpu.sharing", "error", "drop one: mps or single_process"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-custom-1-6656", "model.dtype=float32", "gpu.sharing=mps"],
     "gpu_request_and_sharing", "gpu.sharing", "error", "more vCPUs"),
    (["gpu.sharing=mps", "gpu.machine_type=g2-standard-24", "gpu.count=2"],
     "gpu_request_and_sharing", "gpu.sharing", "error", "gpu.count: 1"),
    (["gpu.sharing=mps", "gpu.machine_type=g2-standard-8", "dataflow_service_options=[enable_prime]"],
     "gpu_request_and_sharing", "gpu.sharing", "error", "drop enable_prime"),
    (["gpu.request=resource_hint", "gpu.sharing=mps", "gpu.machine_type=g2-standard-8"],
     "gpu_request_and_sharing", "gpu.sharing", "error", "gpu.request: worker_accelerator"),
    (["gpu.request=resource_hint",
      "dataflow_service_options=['worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver']"],
     "gpu_request_and_sharing", "gpu.request", "error", "never both"),
    (["model.name=google/flan-t5-xl", "gpu.sharing=model_copies", "gpu.model_copies=4"],
     "gpu_request_and_sharing", "gpu.model_copies", "error", "gpu.model_copies to 3"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-custom-1-6656", "model.dtype=float32",
      "gpu.sharing=single_process"], "gpu_request_and_sharing", "gpu.sharing", "info", "single-vCPU custom type"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-custom-3-6656", "model.dtype=float32"],
     "custom_machine_valid", "gpu.machine_type", "error", "n1-custom-4-6656"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-custom-1-26000-ext", "model.dtype=float32"],
     "custom_machine_valid", "gpu.machine_type", "error", "n1-custom-1-26112-ext"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-custom-1-26624", "model.dtype=float32"],
     "custom_machine_valid", "gpu.machine_type", "error", "n1-custom-1-26624-ext"),
    (["model.name=org/unknown-model"], "model_memory_fits", "model.parameters_m", "warning", "model.parameters_m"),
    (["model.name=google/flan-t5-xxl", "gpu.type=nvidia-a100-80gb", "gpu.machine_type=a2-ultragpu-1g",
      "region=us-central1"], None, None, None, None),
    (["region=southamerica-east1"], "region_offers_gpu", "region", "error", "nvidia-tesla-t4"),
    (["region=mars-north1"], "region_offers_gpu", "region", "warning", "before launching"),
    # N1's caps per GPU: one V100 allows at most 12 vCPUs and 78 GB (catalog/gpus.yaml n1_caps)
    (["gpu.type=nvidia-tesla-v100", "gpu.machine_type=n1-standard-16", "model.dtype=float32"],
     "machine_type_fits_gpu", "gpu.machine_type", "error", "n1-standard-8"),
    (["gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-highmem-64", "model.dtype=float32"],
     "machine_type_fits_gpu", "gpu.machine_type", "error", "n1-standard-8"),
    # A GPU the offline region table lists in no region: it can say nothing of it, so a warning
    (["gpu.type=nvidia-h100-mega-80gb", "gpu.machine_type=a3-megagpu-8g", "gpu.count=8"], "region_offers_gpu",
     "region", "warning", "gcloud compute accelerator-types list"),
    (["gpu.zone=europe-west4-a"], "zone_not_pinned", "gpu.zone", "error", "leave gpu.zone empty"),
]


@pytest.mark.parametrize(("overrides", "rule", "field", "level", "fix_words"), CASES)
def test_rule_fires_with_field_and_fix_and_only_because_of_that_rule(overrides, rule, field, level, fix_words,
                                                                     monkeypatch):
    found = findings(*overrides)
    if rule is None:  # a valid combination: no GPU finding at all
        assert [f for f in found if f.level == "error"] == []
        return
    matching = [f for f in found if f.field == field and f.level == level and fix_words in f.fix]
    assert matching, found
    rule_function = next(r for r in GPU_RULES if r.__name__ == rule)
    monkeypatch.setattr(rules_module, "CONFIG_RULES", [r for r in rules_module.CONFIG_RULES if r is not rule_function])
    assert not [f for f in findings(*overrides) if f.field == field and f.level == level and fix_words in f.fix]


def test_gcp_example_config_passes_preflight_once_its_project_is_set():
    found = findings("project=acme-ml-prod", config_file="configs/gcp.example.yaml")
    assert [f for f in found if f.level == "error"] == []


def test_n1_custom_types_with_extended_memory_are_understood():
    found = findings("gpu.type=nvidia-tesla-t4", "gpu.machine_type=n1-custom-1-26624-ext", "model.dtype=float32")
    assert [f for f in found if f.field in ("gpu.machine_type", "gpu.count")] == []


@pytest.mark.parametrize(("gpu_type", "machine_type", "count"), [
    ("nvidia-h100-80gb", "a3-highgpu-1g", 1), ("nvidia-h100-80gb", "a3-highgpu-2g", 2),
    ("nvidia-h100-80gb", "a3-highgpu-4g", 4), ("nvidia-h100-mega-80gb", "a3-megagpu-8g", 8),
])
def test_every_gpu_and_a3_size_dataflow_lists_is_accepted(gpu_type, machine_type, count):
    found = findings(f"gpu.type={gpu_type}", f"gpu.machine_type={machine_type}", f"gpu.count={count}")
    assert [f for f in found if f.level == "error" and f.field.startswith("gpu.")] == []


def test_an_a3_size_with_the_wrong_count_names_the_machine_that_fits():
    found = findings("gpu.type=nvidia-h100-80gb", "gpu.machine_type=a3-highgpu-2g", "gpu.count=4")
    (problem,) = [f for f in found if f.field == "gpu.count"]
    assert "a3-highgpu-2g has exactly 2" in problem.problem


def test_the_catalog_records_its_sources_and_dates():
    from gpuflow import catalog

    for table in ("gpu_types", "machine_types", "regions"):
        written = datetime.date.fromisoformat(catalog.table_date(table))
        assert catalog._load("gpus")[table]["source"] and written <= datetime.date.today()
    assert catalog._load("models")["source"]


@pytest.mark.parametrize(("overrides", "errors"), [
    (["gpu.request=resource_hint"], ["worker.max_num_workers"]),
    (["gpu.request=resource_hint", "worker.max_num_workers=4", "dataflow.experiments=[disable_streaming_engine]"],
     ["dataflow.experiments"]),
    (["gpu.request=resource_hint", "worker.max_num_workers=4"], []),
    (["worker.max_num_workers=1"], []),  # worker_accelerator: no autoscaling needed
])
def test_streaming_right_fitting_needs_horizontal_autoscaling(overrides, errors):
    from gpuflow.preflight.gpu_rules import streaming_right_fitting_autoscales

    found = list(streaming_right_fitting_autoscales(load_config(None, overrides=overrides)))
    assert [f.field for f in found if f.level == "error"] == errors
    assert all("2 or more" in f.fix for f in found if f.field == "worker.max_num_workers")
    assert any(f.level == "info" and "enable_streaming_rightfitting" in f.problem for f in found) == (
        "gpu.request=resource_hint" in overrides)
    # The streaming workflow's preflight runs it.
    assert [f.field for f in findings(*overrides) if f.level == "error" and f.field in errors] == errors


def live_findings(zones_offering, *overrides):
    config = load_config("configs/gcp.example.yaml", overrides=["project=acme-ml-prod", *overrides])
    return [f for f in run_preflight(config, check_environment=False, zones_offering=zones_offering)
            if f.field == "region"]


def test_on_gcp_the_region_check_asks_compute_engine_and_not_the_table():
    from tests.gcp_fakes import FakeAcceleratorTypesClient

    fake = FakeAcceleratorTypesClient({"me-central2-a": ["nvidia-l4"], "us-central1-a": ["nvidia-tesla-t4"]})
    asked = []

    def zones_offering(gpu_type, region):
        from gpuflow.gpus.quota import zones_offering as live

        asked.append((gpu_type, region))
        return live("acme-ml-prod", gpu_type, region, fake)

    # A region the table does not know, which Compute Engine says offers the GPU: no warning, no error.
    (offered,) = live_findings(zones_offering, "region=me-central2")
    assert offered.level == "info" and "me-central2-a" in offered.problem
    assert fake.requests[-1].filter == 'name = "nvidia-l4"' and fake.requests[-1].project == "acme-ml-prod"
    # A region the table says offers L4, where Compute Engine lists none now: an error with the fix.
    (missing,) = live_findings(zones_offering, "region=us-central1")
    assert missing.level == "error" and "accelerator-types list" in missing.fix
    assert asked == [("nvidia-l4", "me-central2"), ("nvidia-l4", "us-central1")]


def test_when_compute_engine_cannot_be_asked_the_table_decides_and_preflight_says_so():
    def unreachable(gpu_type, region):
        raise PermissionError("compute.acceleratorTypes.list denied")

    found = live_findings(unreachable, "region=southamerica-east1")
    assert [f.level for f in found] == ["warning", "error"]
    assert "using gpuflow's table" in found[0].problem and "nvidia-tesla-t4" in found[1].fix


# -- CPU workers (gpu.type none): guide 002's own pipeline ------------------------------------------------------


CPU = ["gpu.type=none", "gpu.machine_type=n2-highmem-4", "require_gpu=false", "model.name=google/flan-t5-large"]


def test_cpu_workers_on_the_guides_machine_pass_without_any_gpu_rule():
    found = run_preflight(load_config("configs/gcp.example.yaml", overrides=[*CPU, "project=real-project-1"]),
                          check_environment=False)
    assert [f for f in found if f.level == "error"] == []
    assert not any(f.field in ("gpu.type", "region") for f in found)  # no GPU type, so no GPU offering to check


@pytest.mark.parametrize(("override", "field", "fix"), [
    ("require_gpu=true", "require_gpu", "require_gpu: false"),
    ("gpu.machine_type=g2-standard-4", "gpu.machine_type", "n2-highmem-4 (guide 002 runs google/flan-t5-large"),
    ("gpu.request=resource_hint", "gpu.request", "worker_accelerator"),
    ("gpu.sharing=mps", "gpu.sharing", "auto"),
])
def test_cpu_workers_refuse_what_needs_a_gpu(override, field, fix):
    errors = [f for f in findings(*CPU, override) if f.level == "error"]
    assert [(f.field, fix in f.fix) for f in errors] == [(field, True)], errors


def test_cpu_workers_other_than_the_guides_are_noted_with_its_machine():
    (note,) = [f for f in findings(*CPU[:1], "gpu.machine_type=n2-standard-8", *CPU[2:]) if f.field == "gpu.machine_type"]
    assert note.level == "info" and "n2-highmem-4" in note.fix


def test_cpu_workers_options_have_no_accelerator_and_load_the_model_once_per_worker():
    from gpuflow.dataflow.gpu_options import effective_dtype
    from gpuflow.dataflow.options import experiments, job_name_for, service_options
    from gpuflow.gpus.quota import gpu_quota
    from gpuflow.runs.naming import resource_names

    config = load_config("configs/gcp.example.yaml", overrides=CPU)
    assert service_options(config) == []  # no worker_accelerator, no Prime
    assert "no_use_multiple_sdk_containers" in experiments(config, streaming=True)  # guide 002's experiment for the CPU pipeline
    assert effective_dtype(config) == "float32"
    assert job_name_for(resource_names(config, "gf-0123456789"), config, "llm-inference").endswith("-us-central1-cpu")
    assert gpu_quota(config, clients=None) == []  # no GPU quota to read


HINT = ["gpu.request=resource_hint", "worker.max_num_workers=2", "model.name=google/flan-t5-xxl",
        "gpu.type=nvidia-tesla-a100", "gpu.machine_type=a2-highgpu-1g"]


def test_right_fitting_runs_the_unhinted_steps_on_guide_002s_cpu_machine():
    from gpuflow.dataflow.gpu_options import pipeline_machine_type

    config = load_config(None, overrides=HINT)
    assert pipeline_machine_type(config) == "n2-highmem-8"  # guide 002's row for flan-t5-xxl
    (note,) = [f for f in findings(*HINT) if f.field == "worker.machine_type"]
    assert note.level == "info" and "n2-highmem-8" in note.problem and "a2-highgpu-1g" in note.problem
    # A GPU machine for the unhinted steps would bill each of their VMs for GPUs.
    (wrong,) = [f for f in findings(*HINT, "worker.machine_type=g2-standard-4") if f.field == "worker.machine_type"]
    assert wrong.level == "error" and "n2-highmem-8" in wrong.fix


def test_right_fitting_with_prime_sends_no_machine_type_and_refuses_one_set_by_hand():
    from gpuflow.dataflow.gpu_options import pipeline_machine_type

    prime = [*HINT, "dataflow_service_options=[enable_prime]"]
    assert pipeline_machine_type(load_config(None, overrides=prime)) is None
    (note,) = [f for f in findings(*prime) if f.field == "worker.machine_type"]
    assert note.level == "info" and "no machine type is sent" in note.problem
    errors = [f for f in findings(*prime, "worker.machine_type=n2-highmem-8") if f.level == "error"]
    assert [f.field for f in errors] == ["worker.machine_type"] and "Prime" in errors[0].problem


def test_a_model_outside_guide_002s_table_gets_the_cpu_machine_of_the_next_larger_row():
    from gpuflow import catalog

    assert catalog.cpu_worker_machine_for("google/flan-t5-large", None) == "n2-highmem-4"
    assert catalog.cpu_worker_machine_for("my/model", 5000) == "n2-highmem-8"  # between xl (2850M) and xxl
    assert catalog.cpu_worker_machine_for("my/model", 90000) == "n2-highmem-16"  # beyond flan-ul2: its row
    assert catalog.cpu_worker_machine_for("my/model", None) == "n2-highmem-4"
