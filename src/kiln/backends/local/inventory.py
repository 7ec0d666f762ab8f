"""What this machine offers: CPUs, memory, and GPUs found through NVML (or a configured list)."""

from __future__ import annotations

import logging
import os
import socket

import psutil

from kiln.backends.base import Inventory
from kiln.domain.quantities import format_bytes, parse_memory
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


def parse_gpu_list(text: str) -> dict[int, str]:
    """index → model of ``'0,1'`` or ``'0:H200,1:A100'`` (a model not given reads "configured")."""
    text = text.strip()
    if not text:
        return {}
    out: dict[int, str] = {}
    try:
        for item in text.split(","):
            index, _, model = item.partition(":")
            if int(index) in out or int(index) < 0:
                raise ValueError(item)
            out[int(index)] = model.strip() or "configured"
    except ValueError as exc:
        raise ValueError(
            f"KILN_GPUS must list distinct non-negative GPU indices, each optionally with its model "
            f"(e.g. '0,1' or '0:H200,1:H200'), got {text!r}"
        ) from exc
    return out


def local_inventory(settings: Settings) -> Inventory:
    cpus = settings.cpus if settings.cpus is not None else float(os.cpu_count() or 1)
    memory = parse_memory(settings.memory) if settings.memory else int(psutil.virtual_memory().total)
    names = parse_gpu_list(settings.gpus) if settings.gpus is not None else detect_gpus()
    gpus = tuple(names)  # the operator's order is kept; NVML's is by index
    host = socket.gethostname()
    labels = {**settings.node_labels, "kiln.io/hostname": host, "kiln.io/backend": "local"}
    log.info("local inventory: %g CPUs, %s memory, GPUs %s", cpus, format_bytes(memory), list(gpus) or "none")
    return Inventory(cpus=cpus, memory=memory, gpus=gpus, gpu_names=names, name=host, labels=labels)
