# gpuflow-recipe: cuda=none lock=cpu
# gpuflow recipe "cpu": for gpu.type none (CPU workers, guide 002's own pipeline). The Beam SDK image for Python
# ${python_version} and Beam ${beam_version}, plus torch's CPU build from PyTorch's CPU index, installed from
# docker/locks/cpu.lock: no CUDA library, so the image is a fraction of the GPU recipes' size.
# Base images are pinned to their tags, not their digests: no registry (Docker Hub, gcr.io) can be reached from
# the machines that write these recipes. Read a digest with `docker buildx imagetools inspect IMAGE:TAG` and
# append @sha256:... to pin it.
FROM apache/beam_python${python_version}_sdk:${beam_version}

# beam_jobs/ (copied below): the pipeline's pickled functions import its modules from there.
ENV PYTHONPATH=/opt/gpuflow/beam_jobs
ENV PIP_NO_CACHE_DIR=1

COPY worker-requirements.lock /tmp/worker-requirements.lock
RUN pip install --no-deps --require-hashes --extra-index-url https://download.pytorch.org/whl/cpu \
      -r /tmp/worker-requirements.lock \
    && pip check

COPY beam_jobs/ /opt/gpuflow/beam_jobs/

# The Beam SDK image's own entrypoint starts the SDK harness.
ENTRYPOINT ["/opt/apache/beam/boot"]
