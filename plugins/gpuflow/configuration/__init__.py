"""The one typed configuration: the model, how a file and a run's settings load into it, and what each profile's runner can do."""
