"""A job's inputs: datasets, model versions and other jobs' outputs resolved to what the job reads."""
