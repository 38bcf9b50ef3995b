"""What Dataflow states and receives: its documented constraints, the job request, every option gpuflow sends (GPU
options included), and what a running job's state and messages say. The backend is platform/gcp_dataflow.py, the
wait triggers/dataflow.py."""
