"""Experiment tracking through the MLflow protocol, logged models, the runs table."""
