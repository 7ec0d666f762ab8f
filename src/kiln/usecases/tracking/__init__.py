"""Experiment tracking: experiments, runs, what is logged to them (metrics, artifacts, marks) and run search."""
