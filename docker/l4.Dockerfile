# gpuflow-recipe: cuda=12 min_beam=2.50.0 torch=pip
# gpuflow recipe "l4": the Beam SDK image for Python ${python_version} and Beam ${beam_version}, plus a CUDA 12
# build of torch (its pip wheels bring the CUDA runtime libraries). For L4 GPUs: driver >= 525, CUDA >= 12,
# Beam >= 2.50. The GPU driver is NOT installed here: Dataflow installs it on the host
# (worker_accelerator=...;install-nvidia-driver) and mounts it under /usr/local/nvidia.
FROM apache/beam_python${python_version}_sdk:${beam_version}

ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64
# beam_jobs/ (copied below): the pipeline's pickled functions import its modules from there.
ENV PYTHONPATH=/opt/gpuflow/beam_jobs
ENV PIP_NO_CACHE_DIR=1

COPY worker-requirements.txt /tmp/worker-requirements.txt
RUN pip install --upgrade pip \
    && pip install -r /tmp/worker-requirements.txt \
    && pip check

COPY beam_jobs/ /opt/gpuflow/beam_jobs/

# The Beam SDK image's own entrypoint starts the SDK harness.
ENTRYPOINT ["/opt/apache/beam/boot"]
