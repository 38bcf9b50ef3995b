"""Cloud Composer: what an environment gets from gpuflow, and its Airflow REST and environments APIs."""
