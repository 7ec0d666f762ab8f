"""The Slurm backend, first half: its settings (``settings.py``) and the pure renderer of one attempt's sbatch
script (``render.py``, with the program every member runs on its node, ``slurmnode.py``). The controller
(``sbatch``/``squeue``/``scancel``) is not written yet, so no backend class is registered: docs/slurm.md."""
