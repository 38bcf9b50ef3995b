# gpuflow-recipe: cuda=13 min_beam=2.50.0 torch=pip
# gpuflow recipe "vllm": the Beam SDK image for Python ${python_version} and Beam ${beam_version}, plus vLLM, whose
# pip wheel brings its own torch build and CUDA 13 libraries (vllm 0.32.0 requires torch==2.13.0 and
# nvidia-cutlass-dsl[cu13]; see worker-requirements.txt). For inference.engine: vllm: Beam's
# VLLMCompletionsModelHandler starts vLLM's OpenAI-compatible server on each worker. The GPU driver is NOT
# installed here: Dataflow installs it on the host (install-nvidia-driver); its version depends on the
# Container-Optimized OS version Dataflow uses (look for "GPU driver" in the job's logs), and CUDA 13 needs a
# recent one.
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
