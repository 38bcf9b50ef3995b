"""For people and developers, apart from the runtime: the gpuflow command, deploy-composer, the demo report and the
generated docs. Nothing in the runtime imports these."""
