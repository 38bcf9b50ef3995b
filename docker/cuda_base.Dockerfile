# gpuflow-recipe: cuda=12 min_beam=2.46.0 lock=cuda12
# gpuflow recipe "cuda_base": NVIDIA's CUDA 12.4 base image, Python ${python_version} installed into it, and the
# Beam ${beam_version} SDK harness copied in, and torch's CUDA 12 build from docker/locks/cuda12.lock. No driver:
# Dataflow installs it on the host.
# Base images are pinned to their tags, not their digests: no registry (Docker Hub, gcr.io) can be reached from
# the machines that write these recipes. Read a digest with `docker buildx imagetools inspect IMAGE:TAG` and
# append @sha256:... to pin it.
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends software-properties-common \
    && add-apt-repository -y ppa:deadsnakes/ppa \
    && apt-get update \
    && apt-get install -y --no-install-recommends python${python_version} python${python_version}-venv \
    && python${python_version} -m ensurepip --upgrade \
    && ln -sf /usr/bin/python${python_version} /usr/local/bin/python \
    && ln -sf /usr/bin/python${python_version} /usr/local/bin/python3 \
    && rm -rf /var/lib/apt/lists/*

COPY --from=apache/beam_python${python_version}_sdk:${beam_version} /opt/apache/beam /opt/apache/beam

ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64
# beam_jobs/ (copied below): the pipeline's pickled functions import its modules from there.
ENV PYTHONPATH=/opt/gpuflow/beam_jobs
ENV PIP_NO_CACHE_DIR=1

COPY worker-requirements.lock /tmp/worker-requirements.lock
RUN python -m pip install --no-deps --require-hashes -r /tmp/worker-requirements.lock \
    && python -m pip check

COPY beam_jobs/ /opt/gpuflow/beam_jobs/
ENTRYPOINT ["/opt/apache/beam/boot"]
