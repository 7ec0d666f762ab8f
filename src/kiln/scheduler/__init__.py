"""Scheduling: a pure decision function (placement.py) and the loop that applies it (the reconciler)."""
