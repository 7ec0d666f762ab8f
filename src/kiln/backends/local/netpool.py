"""Network namespaces made ahead of need, for every network mode a sandboxed job may ask for (``isolated``,
``none``): a namespace, its ``pasta`` and its nftables rules take tens of milliseconds of set-up (hundreds on a
busy machine), which a job would otherwise wait for between STARTING and RUNNING, and which a burst of jobs
would pay one after the other.

Each namespace is made for one attempt and never reused: made here, moved (a rename: the namespace's bind mount
and pasta come along) into the attempt's network directory when the attempt starts, and removed by the attempt's
last shim when it ends, as one it made itself would be. So a namespace handed out has never held a job: no
listener, no socket, no nft rule or file of anyone else's, and two attempts (of one organisation or two) never
share one; nothing has to be scrubbed between jobs.

How many: for each mode, the attempts that started in that mode in the last ``WINDOW_SECONDS``, at least
``network_pool_min`` and at most ``network_pool_max`` (settings). A burst raises the target as it comes and the
next one finds them ready; an idle server drops what is beyond ``network_pool_min``, one per second. The
spares are made by one background task (``network-spares``, run by the server's task runner: ``fill_once``)
woken by every start. An attempt that finds none makes its own (its shim does), so a burst is never held up by
the pool; ``misses`` counts those (and the server logs each).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

from kiln.backends.local.network import Networking, attempt_network
from kiln.injob import netns
from kiln.settings import Settings

log = logging.getLogger(__name__)

MODES = ("isolated", "none")
WINDOW_SECONDS = 10.0  # the starts that size the pool
TRIM_SECONDS = 1.0  # an idle pool lets go of one spare beyond its minimum this often
FAILED_SECONDS = 30.0  # the wait after a spare could not be made


class SparePool:
    """The spares of each mode, ready in ``<run dir>/net/spare-<mode>-*`` (made in ``making-*`` beside them)."""

    def __init__(self, networking: Networking, settings: Settings) -> None:
        self.networking = networking
        self.settings = settings
        self.low = max(0, settings.network_pool_min)
        self.high = max(self.low, settings.network_pool_max)
        self.top = settings.run_dir / "net"
        self._ready: dict[str, deque[Path]] = {mode: deque() for mode in MODES}
        self._starts: dict[str, deque[float]] = {mode: deque() for mode in MODES}
        self.misses: dict[str, int] = dict.fromkeys(MODES, 0)  # attempts that found no spare of their mode
        self.handed_out: dict[str, int] = dict.fromkeys(MODES, 0)
        self._lock = threading.Lock()
        self.wake = threading.Event()  # an attempt started: the pool may be short now
        self._closed = False
        for pattern in ("spare-*", "making-*"):  # a previous server's
            for stale in self.top.glob(pattern) if self.top.is_dir() else ():
                netns.cleanup(str(stale))

    @property
    def wanted(self) -> bool:
        """Does this machine make spares at all (job networks available, a pool size above 0)?"""
        return self.networking.available and self.high > 0

    def ready(self, mode: str) -> int:
        with self._lock:
            return len(self._ready[mode])

    def target(self, mode: str, now: float | None = None) -> int:
        """The spares of ``mode`` to keep now: the starts of the last WINDOW_SECONDS, within [min, max]."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return self._target(mode, now)

    def _target(self, mode: str, now: float) -> int:
        starts = self._starts[mode]
        while starts and starts[0] < now - WINDOW_SECONDS:
            starts.popleft()
        return min(self.high, max(self.low, len(starts)))

    def take(self, config: dict[str, Any]) -> bool:
        """Move a spare to ``config["dir"]`` when one fits (its mode, the rules it was made with); False: the
        attempt's shim makes its own."""
        mode = config.get("mode")
        if mode not in MODES or not self.wanted:
            return False
        with self._lock:
            self._starts[mode].append(time.monotonic())
            self.wake.set()
            ready = self._ready[mode]
            while ready:
                spare = ready.popleft()
                if json.loads((spare / "config.json").read_text()) != _fits(config):
                    netns.cleanup(str(spare))  # the rules changed since it was made
                    continue
                target = Path(config["dir"])
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    spare.rename(target)
                except OSError:
                    netns.cleanup(str(spare))
                    continue
                (target / "config.json").unlink()
                self.handed_out[mode] += 1
                return True
            self.misses[mode] += 1
            missed = self.misses[mode]
        log.info("job network: no spare %s network was ready (%d so far): the attempt makes its own", mode, missed)
        return False

    def fill_once(self) -> float | None:
        """One step of the background task: make one spare for the mode furthest below its target, or let go of
        one beyond it. 0: step again at once; None: wait for a start (or the task's interval)."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return None
            short = {m: self._target(m, now) - len(self._ready[m]) for m in MODES}
            mode = max(MODES, key=lambda m: short[m])
            if short[mode] <= 0:
                extra = next((m for m in MODES if short[m] < 0), None)
                if extra is None:
                    return None
                spare = self._ready[extra].pop()  # the newest: the oldest go out first
                netns.cleanup(str(spare))
                return TRIM_SECONDS
        made = self._make(mode)
        if made is None:
            return FAILED_SECONDS
        with self._lock:
            if self._closed:
                netns.cleanup(str(made))
                return None
            self._ready[mode].append(made)
        return 0.0

    def _make(self, mode: str) -> Path | None:
        name = f"{mode}-{uuid.uuid4().hex[:12]}"
        making, spare = self.top / f"making-{name}", self.top / f"spare-{name}"
        config = attempt_network(self.networking, self.settings, mode, "spare", 0)
        assert config is not None
        config["dir"] = str(making)
        try:
            net = netns.JobNetwork(config)
            try:
                net.acquire("spare")
            finally:
                net.close()
            (making / "users" / "spare").unlink()
            (making / "config.json").write_text(json.dumps(_fits(config)))
            making.rename(spare)
        except (netns.NetworkError, OSError) as exc:
            log.warning("job network: a spare %s network could not be made (%s); attempts make their own", mode, exc)
            netns.cleanup(str(making))
            return None
        return spare

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for ready in self._ready.values():
                for spare in ready:
                    netns.cleanup(str(spare))
                ready.clear()


def _fits(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config.get(k) for k in ("mode", "pasta", "nft", "forward", "rules")}
