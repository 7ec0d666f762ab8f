"""Notebooks and TensorBoard."""
