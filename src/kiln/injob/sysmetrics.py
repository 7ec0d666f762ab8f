"""System metrics of a job: CPU and memory of its processes (``/proc``) and its GPUs' utilisation and memory
(NVML through ctypes, where there is an NVIDIA driver).

Standard library only, like ``extract`` (which loads it; see there).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _proc_stat(pid: int) -> tuple[int, int, int] | None:
    """(utime + stime ticks, start time ticks, rss pages) of a process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
        fields = stat[stat.rfind(b")") + 2 :].split()
        return int(fields[11]) + int(fields[12]), int(fields[19]), int(fields[21])
    except (OSError, IndexError, ValueError):
        return None


class Nvml:
    """The few NVML calls needed, through ctypes; ``load()`` is None where there is no NVIDIA driver."""

    def __init__(self, lib: Any) -> None:
        import ctypes

        self.ctypes = ctypes
        self.lib = lib

        class Utilization(ctypes.Structure):
            _fields_ = [("gpu", ctypes.c_uint), ("memory", ctypes.c_uint)]

        class Memory(ctypes.Structure):
            _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]

        self.Utilization = Utilization
        self.Memory = Memory
        self.handles: dict[str, Any] = {}

    @classmethod
    def load(cls) -> Nvml | None:
        try:
            import ctypes

            lib = ctypes.CDLL("libnvidia-ml.so.1")
            if lib.nvmlInit_v2() != 0:
                return None
        except (OSError, AttributeError):
            return None
        return cls(lib)

    def handle(self, device: str) -> Any:
        if device in self.handles:
            return self.handles[device]
        ctypes = self.ctypes
        handle = ctypes.c_void_p()
        if device.isdigit():
            rc = self.lib.nvmlDeviceGetHandleByIndex_v2(ctypes.c_uint(int(device)), ctypes.byref(handle))
        else:
            rc = self.lib.nvmlDeviceGetHandleByUUID(ctypes.c_char_p(device.encode()), ctypes.byref(handle))
        self.handles[device] = handle if rc == 0 else None
        return self.handles[device]

    def sample(self, device: str) -> dict[str, float]:
        out: dict[str, float] = {}
        handle = self.handle(device)
        if handle is None:
            return out
        util = self.Utilization()
        if self.lib.nvmlDeviceGetUtilizationRates(handle, self.ctypes.byref(util)) == 0:
            out["util_percent"] = float(util.gpu)
        memory = self.Memory()
        if self.lib.nvmlDeviceGetMemoryInfo(handle, self.ctypes.byref(memory)) == 0:
            out["memory_bytes"] = float(memory.used)
        return out


def visible_gpus(env: dict) -> list[str]:
    value = str(env.get("CUDA_VISIBLE_DEVICES") or "").strip()
    if not value or value in ("-1", "NoDevFiles", "none"):
        return []
    return [d.strip() for d in value.split(",") if d.strip()]


class SystemSampler:
    """CPU (percent of one core, summed over the job's processes, and seconds used so far), RSS and per-GPU
    utilisation and memory."""

    def __init__(self, tree: Callable[[], list[int]], gpus: list[str], nvml: Nvml | None = None) -> None:
        self.tree = tree
        self.gpus = gpus
        self.nvml = nvml
        self.prev: dict[tuple[int, int], int] = {}  # (pid, start ticks) → cpu ticks at the previous sample
        self.prev_time: float | None = None
        self.cpu_seconds = 0.0  # used by the job's processes so far (what metering reports as used)

    def sample(self) -> dict[str, float]:
        now = time.monotonic()
        ticks: dict[tuple[int, int], int] = {}
        rss = 0
        for pid in self.tree():
            stat = _proc_stat(pid)
            if stat is not None:
                ticks[(pid, stat[1])] = stat[0]
                rss += stat[2] * PAGE_SIZE
        out: dict[str, float] = {"system/rss_bytes": float(rss)}
        # A process new since the last sample counts from its start (the job's processes start with it).
        used = max(0, sum(value - self.prev.get(key, 0) for key, value in ticks.items()))
        self.cpu_seconds += used / CLK_TCK
        out["system/cpu_seconds"] = round(self.cpu_seconds, 3)
        if self.prev_time is not None and now > self.prev_time:
            out["system/cpu_percent"] = round(used / CLK_TCK / (now - self.prev_time) * 100.0, 2)
        self.prev, self.prev_time = ticks, now
        if self.nvml is not None:
            for i, device in enumerate(self.gpus):
                try:
                    for name, value in self.nvml.sample(device).items():
                        out[f"system/gpu{i}/{name}"] = value
                except Exception:
                    pass
        return out
