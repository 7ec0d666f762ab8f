"""The Slurm backend: the controller (``backend.py``, with ``queue.py`` mapping what ``squeue`` and ``scontrol``
say), the commands it runs (``settings.py``), and the pure renderer of one attempt's sbatch script (``render.py``,
with the program every member runs on its node, ``slurmnode.py``). docs/slurm.md."""
