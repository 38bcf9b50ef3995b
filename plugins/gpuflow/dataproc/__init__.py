"""Dataproc Serverless GPU batches: the limits, the memory split and the Batch request (the step: steps/dataproc_batch.py)."""
