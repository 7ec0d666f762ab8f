"""Placement: which waiting jobs start now and where, which running ones to preempt, why the others wait.
Pure and deterministic (no database, no processes, no I/O), so that both the reconciler (kiln.scheduler) and
the submit-time check (kiln.usecases.jobs.jobs: can this job ever fit?) ask the same function. ``policy.decide`` is the
entry point; ``types`` holds the values it works on."""
