"""Scheduling: a pure decision function (policy.py, with fairshare.py and packing.py), the inputs it is given
(inputs.py) and the loop that carries its decisions out (loop.py)."""
