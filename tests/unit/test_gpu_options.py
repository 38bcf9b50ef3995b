import pytest

from gpuflow.configuration.loading import load_config
from gpuflow.dataflow.gpu_options import AcceleratorOptionError, parse_worker_accelerator, worker_accelerator


def test_built_option_has_dataflows_token_order():
    config = load_config(None, overrides=["gpu.type=nvidia-tesla-t4", "gpu.count=2"])
    assert worker_accelerator(config) == "worker_accelerator=type:nvidia-tesla-t4;count:2;install-nvidia-driver"


def test_round_trip_and_mps():
    parsed = parse_worker_accelerator("worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver;use_nvidia_mps")
    assert (parsed.type, parsed.count, parsed.install_driver, parsed.use_mps) == ("nvidia-l4", 1, True, True)
    assert parsed.option() == "worker_accelerator=type:nvidia-l4;count:1;install-nvidia-driver;use_nvidia_mps"


@pytest.mark.parametrize(
    ("option", "problem"),
    [
        ("type:nvidia-l4;count:1;install-nvidia-driver", "does not start with"),
        ("worker_accelerator=count:1;type:nvidia-l4;install-nvidia-driver", "out of order"),
        ("worker_accelerator=type:nvidia-l4;install-nvidia-driver;count:1", "out of order"),
        ("worker_accelerator=install-nvidia-driver;type:nvidia-l4;count:1", "out of order"),
        ("worker_accelerator=type:nvidia-l4;count:one;install-nvidia-driver", "positive integer"),
        ("worker_accelerator=type:nvidia-l4;count:0;install-nvidia-driver", "positive integer"),
        ("worker_accelerator=type:;count:1;install-nvidia-driver", "type has no value"),
        ("worker_accelerator=type:nvidia-l4;;count:1", "empty token"),
        ("worker_accelerator=type:nvidia-l4;count:1;install-driver", "unknown tokens"),
    ],
)
def test_malformed_options_are_rejected_with_the_expected_form(option, problem):
    with pytest.raises(AcceleratorOptionError) as raised:
        parse_worker_accelerator(option)
    assert problem in str(raised.value)
    assert "type:GPU_TYPE;count:N;install-nvidia-driver" in str(raised.value)
