"""Thin Airflow operators over gpuflow.steps, one module per DAG (``base`` holds what they share).

Nothing is imported here: a DAG file imports its own module, so that parsing it defines only its operators.
"""
