"""The guide's standalone-VM debugging: run the worker image by hand on a GPU VM.

When workers never start or see no GPU, the Dataflow GPU guide suggests reproducing the worker on a
Container-Optimized OS VM with the same accelerator: install the driver, then ``docker run`` the image
with the NVIDIA volumes mounted and the entrypoint replaced by a shell.
"""

from __future__ import annotations

import shlex

from gpuflow.configuration.model import GpuflowConfig


def debug_vm_commands(config: GpuflowConfig, image: str, vm_name: str = "gpuflow-debug-vm") -> str:
    """The lines to paste, every value from the configuration shell-quoted (``shlex.quote``): a value holding ``;``
    or a space stays one argument. Control characters never get here: the configuration model refuses them."""
    if any(ord(character) < 32 or ord(character) == 127 for character in image + vm_name):
        raise ValueError("the image and the VM name must not hold control characters")
    q = shlex.quote
    zone = q(config.gpu.zone or f"{config.region}-a")
    registry = q(image.split("/", 1)[0] if "/" in image else "gcr.io")
    gpu_type, machine_type, project, region = (q(config.gpu.type), q(config.gpu.machine_type), q(config.project),
                                               q(config.region))
    vm_name, image = q(vm_name), q(image)
    return f"""\
# 1. A Container-Optimized OS VM with the same accelerator as the workers ({config.gpu.count} x {gpu_type}).
#    {"" if config.gpu.zone else f"Zone {zone} is a guess: pick a zone of {region} that offers {gpu_type}."}
gcloud compute instances create {vm_name} \\
    --project={project} --zone={zone} \\
    --machine-type={machine_type} \\
    --accelerator=type={gpu_type},count={config.gpu.count} \\
    --maintenance-policy=TERMINATE --restart-on-failure \\
    --image-project=cos-cloud --image-family=cos-stable \\
    --boot-disk-size={max(config.worker.disk_size_gb, 50)}GB --scopes=cloud-platform

# 2. On the VM: install the NVIDIA driver and check that it sees the GPU.
gcloud compute ssh {vm_name} --project={project} --zone={zone}
sudo cos-extensions install gpu
sudo mount --bind /var/lib/nvidia /var/lib/nvidia
sudo mount -o remount,exec /var/lib/nvidia
/var/lib/nvidia/bin/nvidia-smi

# 3. Still on the VM: run the worker image with the driver mounted where Dataflow mounts it,
#    and a shell instead of the Beam boot entrypoint.
docker-credential-gcr configure-docker --registries {registry}
docker run --rm -it --entrypoint=/bin/bash \\
    --volume /var/lib/nvidia/lib64:/usr/local/nvidia/lib64 \\
    --volume /var/lib/nvidia/bin:/usr/local/nvidia/bin \\
    --privileged \\
    {image}

# 4. Inside the container:
/usr/local/nvidia/bin/nvidia-smi
python -c "import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available())"
python -c "import apache_beam; print(apache_beam.__version__)"; python --version

# 5. Delete the VM when done: it bills by the second.
gcloud compute instances delete {vm_name} --project={project} --zone={zone} --quiet
"""
