"""The Dataproc Serverless GPU guide's sample job: count the executors' GPUs, then join two big DataFrames.

    python spark_jobs/gpu_count_join.py [--rows 10000000]      (or as a Dataproc Serverless PySpark batch)

It prints one line ``GPUFLOW_RESULT {json}`` with the accelerator count and the join's row count, which
gpuflow reads back (from the process output locally, from the driver output in GCS on Dataproc).
A missing nvidia-smi counts as 0 GPUs with a note; it never fails the job.
"""

import argparse
import json
import os
import shutil
import socket
import subprocess

RESULT_MARKER = "GPUFLOW_RESULT "
NVIDIA_SMI_PATHS = ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi")


def gpus_on_this_executor(_partition):
    """(host, GPU count, note) as nvidia-smi -L lists them on the executor running this partition."""
    smi = shutil.which("nvidia-smi") or next((p for p in NVIDIA_SMI_PATHS if os.path.exists(p)), None)
    if smi is None:
        yield socket.gethostname(), 0, "nvidia-smi not found on the executor: no GPU driver, so 0 GPUs"
        return
    listing = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
    gpus = [line for line in listing.stdout.splitlines() if line.startswith("GPU ")]
    note = "" if listing.returncode == 0 else f"nvidia-smi exited {listing.returncode}: {listing.stderr.strip()}"
    yield socket.gethostname(), len(gpus), note


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000)
    args = parser.parse_args(argv)

    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("gpuflow-gpu-count-join").getOrCreate()
    context = spark.sparkContext
    slices = max(int(spark.conf.get("spark.executor.instances", "2")), 1) * 4
    readings = context.parallelize(range(slices), slices).mapPartitions(gpus_on_this_executor).collect()
    per_host = {}
    for host, count, _ in readings:
        per_host[host] = max(per_host.get(host, 0), count)
    notes = sorted({note for _, _, note in readings if note})

    left = spark.range(args.rows).selectExpr("id AS key", "id * 2 AS doubled")
    right = spark.range(args.rows).selectExpr("id AS key", "id % 7 AS bucket")
    joined = left.join(right, "key").count()

    result = {"accelerator_count": sum(per_host.values()), "hosts": len(per_host), "joined_rows": joined,
              "notes": notes}
    print(RESULT_MARKER + json.dumps(result), flush=True)
    spark.stop()
    return result


if __name__ == "__main__":
    main()
