"""The Flex Template launcher's entry point (FLEX_TEMPLATE_PYTHON_PY_FILE in a launch.mode: flex_template image).

The launcher runs this file in the worker image itself, so the job is pickled by the very Beam and Python
the workers run. ``--gpuflow_job`` says which pipeline; every other parameter goes to that pipeline.
It returns once the job is submitted: gpuflow's task watches the job through the Dataflow API.
"""

import argparse
import logging
import os
import sys

JOBS = ("llm_inference", "gpu_check")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpuflow_job", choices=JOBS, required=True)
    known, rest = parser.parse_known_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    job = __import__(known.gpuflow_job)
    job.run(rest, wait=False)


if __name__ == "__main__":
    logging.getLogger().setLevel(logging.INFO)
    main()
