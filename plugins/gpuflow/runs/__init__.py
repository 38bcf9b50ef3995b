"""A DAG run: its trigger form, what its conf may choose, its tasks' timeouts, its resource names and batch paths, and a
lasting deployment's rollout plan."""
