# gpuflow-recipe: cuda=12 min_beam=2.50.0 lock=cuda12
# gpuflow recipe "l4": the Beam SDK image for Python ${python_version} and Beam ${beam_version}, plus torch's CUDA 12
# build from PyPI (its wheels bring the CUDA runtime libraries), installed from docker/locks/cuda12.lock. For L4 GPUs
# guide 003 asks for driver >= 525, CUDA >= 12 and Beam >= 2.50. The GPU driver is NOT installed here: Dataflow
# installs it on the host (worker_accelerator=...;install-nvidia-driver) and mounts it under /usr/local/nvidia.
# Base images are pinned to their tags, not their digests: no registry (Docker Hub, gcr.io) can be reached from
# the machines that write these recipes. Read a digest with `docker buildx imagetools inspect IMAGE:TAG` and
# append @sha256:... to pin it.
FROM apache/beam_python${python_version}_sdk:${beam_version}

ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64
# beam_jobs/ (copied below): the pipeline's pickled functions import its modules from there.
ENV PYTHONPATH=/opt/gpuflow/beam_jobs
ENV PIP_NO_CACHE_DIR=1

COPY worker-requirements.lock /tmp/worker-requirements.lock
RUN pip install --no-deps --require-hashes -r /tmp/worker-requirements.lock \
    && pip check

COPY beam_jobs/ /opt/gpuflow/beam_jobs/

# The Beam SDK image's own entrypoint starts the SDK harness.
ENTRYPOINT ["/opt/apache/beam/boot"]
