"""Executors behind one interface (see base.py); the local executor is the embedded default."""
