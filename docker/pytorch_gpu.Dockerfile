# gpuflow-recipe: cuda=12 min_beam=2.46.0 torch=image
# gpuflow recipe "pytorch_gpu": start from an image already set up for GPUs (PyTorch with the CUDA 12.4
# runtime and cuDNN) and copy the Beam SDK harness in. The image's Python must be ${python_version}:
# pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime ships Python 3.11; pick the tag that matches otherwise.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

COPY --from=apache/beam_python${python_version}_sdk:${beam_version} /opt/apache/beam /opt/apache/beam

ENV LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/cuda/lib64
# beam_jobs/ (copied below): the pipeline's pickled functions import its modules from there.
ENV PYTHONPATH=/opt/gpuflow/beam_jobs
ENV PIP_NO_CACHE_DIR=1

COPY worker-requirements.txt /tmp/worker-requirements.txt
RUN pip install -r /tmp/worker-requirements.txt && pip check

COPY beam_jobs/ /opt/gpuflow/beam_jobs/
ENTRYPOINT ["/opt/apache/beam/boot"]
