"""What this machine offers: CPUs, memory, and GPUs found through NVML (or a configured list)."""

from __future__ import annotations

import logging
import os

import psutil

from kiln.backends.base import Inventory
from kiln.domain.quantities import parse_memory
from kiln.settings import Settings

log = logging.getLogger(__name__)


def detect_gpus() -> dict[int, str]:
    """index → model name for every NVIDIA GPU NVML reports; empty where there is no driver."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no library: a CPU machine
        return {}
    try:
        out = {}
        for index in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            out[index] = name.decode() if isinstance(name, bytes) else str(name)
        return out
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass


def parse_gpu_list(text: str) -> tuple[int, ...]:
    text = text.strip()
    if not text:
        return ()
    try:
        indices = tuple(int(x) for x in text.split(","))
    except ValueError as exc:
        raise ValueError(f"KILN_GPUS must be comma-separated GPU indices, got {text!r}") from exc
    if len(set(indices)) != len(indices) or any(i < 0 for i in indices):
        raise ValueError(f"KILN_GPUS must list distinct non-negative indices, got {text!r}")
    return indices


def local_inventory(settings: Settings) -> Inventory:
    cpus = settings.cpus if settings.cpus is not None else float(os.cpu_count() or 1)
    memory = parse_memory(settings.memory) if settings.memory else int(psutil.virtual_memory().total)
    if settings.gpus is not None:
        gpus = parse_gpu_list(settings.gpus)
        names = {i: "configured" for i in gpus}
    else:
        names = detect_gpus()
        gpus = tuple(sorted(names))
    log.info("local inventory: %.1f CPUs, %d bytes memory, GPUs %s", cpus, memory, list(gpus) or "none")
    return Inventory(cpus=cpus, memory=memory, gpus=gpus, gpu_names=names)
