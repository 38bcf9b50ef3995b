# gpuflow-recipe: cuda=13 also_cuda=12 min_beam=2.50.0 lock=vllm
# gpuflow recipe "vllm": the Beam SDK image for Python ${python_version} and Beam ${beam_version}, plus vLLM, whose
# pip wheel brings its own torch build and CUDA 13 libraries (vllm 0.32.0 requires torch==2.13.0 and
# nvidia-cutlass-dsl[cu13]; see docker/locks/vllm.lock). For inference.engine: vllm: Beam's
# VLLMCompletionsModelHandler starts vLLM's OpenAI-compatible server on each worker. The GPU driver is NOT
# installed here: Dataflow installs it on the host (install-nvidia-driver); its version depends on the
# Container-Optimized OS version Dataflow uses (look for "GPU driver" in the job's logs), and CUDA 13 needs
# driver >= 580. also_cuda=12: nvidia-cutlass-dsl 4.8.0 (a vllm dependency) installs its CUDA 12 libraries
# (nvidia-cutlass-dsl-libs-cu12) beside the CUDA 13 ones its [cu13] extra asks for; they need no newer driver.
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
