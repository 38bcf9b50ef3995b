# gpuflow-recipe: cuda=12 min_beam=2.46.0 lock=cuda12
# gpuflow recipe "beam_sdk_cuda": the Beam SDK image (Python ${python_version}, Beam ${beam_version}) with NVIDIA's
# CUDA 12 toolkit added from NVIDIA's Debian repository, for libraries that need the toolkit beyond what
# torch's wheels bring; torch's CUDA 12 build from docker/locks/cuda12.lock. No driver: Dataflow installs it on
# the host and mounts it under /usr/local/nvidia.
# Base images are pinned to their tags, not their digests: no registry (Docker Hub, gcr.io) can be reached from
# the machines that write these recipes. Read a digest with `docker buildx imagetools inspect IMAGE:TAG` and
# append @sha256:... to pin it.
FROM apache/beam_python${python_version}_sdk:${beam_version}

RUN apt-get update \
    && apt-get install -y --no-install-recommends wget ca-certificates gnupg \
    && wget -q https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
    && dpkg -i cuda-keyring_1.1-1_all.deb && rm cuda-keyring_1.1-1_all.deb \
    && apt-get update \
    && apt-get install -y --no-install-recommends cuda-toolkit-12-4 \
    && rm -rf /var/lib/apt/lists/*

ENV PATH=/usr/local/cuda/bin:$${PATH}
ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64
# beam_jobs/ (copied below): the pipeline's pickled functions import its modules from there.
ENV PYTHONPATH=/opt/gpuflow/beam_jobs
ENV PIP_NO_CACHE_DIR=1

COPY worker-requirements.lock /tmp/worker-requirements.lock
RUN pip install --no-deps --require-hashes -r /tmp/worker-requirements.lock \
    && pip check

COPY beam_jobs/ /opt/gpuflow/beam_jobs/
ENTRYPOINT ["/opt/apache/beam/boot"]
