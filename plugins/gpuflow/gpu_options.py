"""Dataflow's GPU service option, built by us and checked when a user writes one by hand.

Dataflow wants ``worker_accelerator=type:GPU;count:N;install-nvidia-driver`` with the tokens in
that order (``use_nvidia_mps`` may follow). A hand-written option with tokens out of order or
malformed fails at job submission, or worse, runs without a driver.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuflow.config import GpuflowConfig

PREFIX = "worker_accelerator="
_ORDER = ("type", "count", "install-nvidia-driver")
_OPTIONAL_TRAILING = ("use_nvidia_mps",)


class AcceleratorOptionError(ValueError):
    pass


@dataclass(frozen=True)
class WorkerAccelerator:
    type: str
    count: int
    install_driver: bool
    use_mps: bool = False

    def option(self) -> str:
        tokens = [f"type:{self.type}", f"count:{self.count}"]
        if self.install_driver:
            tokens.append("install-nvidia-driver")
        if self.use_mps:
            tokens.append("use_nvidia_mps")
        return PREFIX + ";".join(tokens)


def worker_accelerator(config: GpuflowConfig) -> str:
    """The option gpuflow sends: always with the driver, which Dataflow installs on the host; MPS when chosen."""
    return WorkerAccelerator(config.gpu.type, config.gpu.count, install_driver=True,
                             use_mps=effective_sharing(config) == "mps").option()


#: Dataflow's right-fitting page (docs.cloud.google.com/dataflow/docs/guides/right-fitting), "accelerator":
#: ``type:GPU_TYPE;count:GPU_COUNT;machine_type:MACHINE_TYPE;CONFIGURATION_OPTIONS`` -- the GPU's machine type
#: goes inside the hint.
def accelerator_hint(config: GpuflowConfig) -> str:
    """Beam's ``accelerator`` resource hint for right fitting, with the GPU's machine type inside it."""
    return (f"type:{config.gpu.type};count:{config.gpu.count};machine_type:{config.gpu.machine_type};"
            "install-nvidia-driver")


def effective_sharing(config: GpuflowConfig) -> str:
    """gpu.sharing, with ``auto`` decided from the memory one model copy takes ("default": Dataflow's own)."""
    if config.gpu.sharing != "auto":
        return config.gpu.sharing
    from gpuflow.preflight.gpu_rules import SINGLE_PROCESS_SHARE, model_gpu_share

    share = model_gpu_share(config)
    return "single_process" if share is not None and share > SINGLE_PROCESS_SHARE else "default"


def parse_worker_accelerator(option: str) -> WorkerAccelerator:
    """Parse ``worker_accelerator=...``; raise with the exact problem and the expected form."""
    expected = "expected worker_accelerator=type:GPU_TYPE;count:N;install-nvidia-driver"
    if not option.startswith(PREFIX):
        raise AcceleratorOptionError(f"{option!r} does not start with {PREFIX!r}; {expected}")
    tokens = [token.strip() for token in option[len(PREFIX):].split(";")]
    if any(not token for token in tokens):
        raise AcceleratorOptionError(f"{option!r} has an empty token (a stray ';'); {expected}")
    names = [token.split(":", 1)[0] for token in tokens]
    unknown = [n for n in names if n not in _ORDER + _OPTIONAL_TRAILING]
    if unknown:
        raise AcceleratorOptionError(f"{option!r} has unknown tokens {unknown}; {expected}")
    required = [n for n in names if n in _ORDER]
    if required[:2] != ["type", "count"] or names[:2] != ["type", "count"]:
        raise AcceleratorOptionError(f"{option!r}: tokens out of order, type and count must come first; {expected}")
    if required != [n for n in _ORDER if n in required] or (
        "install-nvidia-driver" in names and names.index("install-nvidia-driver") != 2
    ):
        raise AcceleratorOptionError(f"{option!r}: tokens out of order; {expected}")
    values = dict(token.split(":", 1) if ":" in token else (token, "") for token in tokens)
    if not values["type"]:
        raise AcceleratorOptionError(f"{option!r}: type has no value; {expected}")
    if not values["count"].isdigit() or int(values["count"]) < 1:
        raise AcceleratorOptionError(f"{option!r}: count must be a positive integer; {expected}")
    return WorkerAccelerator(
        type=values["type"],
        count=int(values["count"]),
        install_driver="install-nvidia-driver" in values,
        use_mps="use_nvidia_mps" in values,
    )
