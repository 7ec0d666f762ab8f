"""Network namespaces made ahead of need, for every network mode a sandboxed job may ask for (``isolated``,
``none``): a namespace, its ``pasta`` and its nftables rules take tens of milliseconds of set-up (hundreds on a
busy machine), which a job would otherwise wait for between STARTING and RUNNING, and which a burst of jobs
would pay one after the other. A ``none`` namespace has no pasta (its shim serves the Kiln API's port,
``injob/apiport.py``): a few milliseconds, still off the job's path here.

A spare is made for one attempt: made here, moved (a rename: the namespace's bind mount and pasta come along)
into the attempt's network directory when the attempt starts. When the attempt ends, its last shim hands the
namespace back (``used-<mode>-<hex>-<organisation>``) if it holds nothing (``netns.holds_nothing``: no socket but
its pasta's own; the job's processes are gone, its files were never in it, its nft rules are the operator's and it
could not change them), else removes it; a namespace handed back goes to the next attempt **of the same
organisation** that asks for its mode, never to another's. An isolated namespace's pasta costs ~28 ms of CPU to
start (the kernel zeroing the ~30 MB it touches) — the largest share of a sandboxed start's CPU — so a burst of
one team's jobs now pays it once per namespace, not once per job. What a reused namespace may still tell its next
job is its counters (``/proc/net/snmp``: how many connections and datagrams the previous job of the same
organisation made); nothing of another organisation's ever.

How many, per mode: the starts expected while spares are made, i.e. the starts of the last ``RATE_SECONDS`` times
the lead (``LEAD_SECONDS``, or twice what making one took lately, whichever is longer), at least
``network_pool_min`` and at most ``network_pool_max`` (settings). So a burst raises the target only as far as
it needs to keep ahead of its own starts, and the target falls back to the minimum within ``RATE_SECONDS`` of the
burst's last start: nothing more is made for a burst that is over (the pool sized by the starts of the last 10 s
went on making up to 32 spares, each a pasta, after a burst had ended, most of them never used). Spares beyond the
target are kept for ``WINDOW_SECONDS`` after the mode's last start (a burst may resume), then let go, one per
``TRIM_SECONDS``. The spares are made one at a time by one background task (``network-spares``, run by the
server's task runner: ``fill_once``) woken by every start, their pasta and nft at idle priority until ready
(``"background"``: they take only CPU no job wants; the pasta is back at the usual priority once it may serve a
job). An attempt that finds none makes its own (its shim does), so a burst is never held up by the pool.

What it did is counted per mode (``handed_out``, ``misses``: attempts that made their own, ``made``, ``let_go``:
made and never used) and logged: each miss, and a summary once a burst has been served and at stop. A server
killed leaves its spares and their pastas behind: the next one on the same home removes them as it starts
(:func:`sweep`), and a server that stops removes its own, the one being made included (it is given up). Namespaces
handed back count as ready for the pool's target (any organisation's), are kept at most ``network_pool_max`` per
mode, and are let go like spares once their mode has had no start for ``WINDOW_SECONDS``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
import uuid
from collections import deque
from pathlib import Path
from typing import Any

import psutil

from kiln.backends.local.network import Networking, attempt_network
from kiln.injob import netns
from kiln.settings import Settings

log = logging.getLogger(__name__)

MODES = ("isolated", "none")
RATE_SECONDS = 1.0  # the start rate that sizes the pool is measured over this long
LEAD_SECONDS = 0.25  # at least: the spares kept are the starts expected in this long (or twice a spare's making)
WINDOW_SECONDS = 10.0  # spares beyond the target are kept this long after the mode's last start
TRIM_SECONDS = 1.0  # then one is let go this often
FAILED_SECONDS = 30.0  # the wait after a spare could not be made
SUMMARY_SECONDS = 10.0  # a summary is logged when the pool has nothing to do and this long has passed since the last
STOP_WAIT_SECONDS = 5.0  # at stop: the longest the spare being made is waited for (it is given up at once)
USED = "used-"  # a namespace an attempt handed back: used-<mode>-<hex>-<organisation id>
PREFIXES = ("spare-", "making-", USED)  # the pool's own directories under <run dir>/net (an attempt's: <job>-<n>)


class SparePool:
    """The spares of each mode, ready in ``<run dir>/net/spare-<mode>-*`` (made in ``making-*`` beside them)."""

    def __init__(self, networking: Networking, settings: Settings) -> None:
        self.networking = networking
        self.settings = settings
        self.low = max(0, settings.network_pool_min)
        self.high = max(self.low, settings.network_pool_max)
        self.top = settings.run_dir / "net"
        self.modes = tuple(m for m in MODES if m in networking.modes)
        self._ready: dict[str, deque[tuple[Path, dict[str, Any]]]] = {mode: deque() for mode in MODES}
        self._starts: dict[str, deque[float]] = {mode: deque() for mode in MODES}
        self._last_start: dict[str, float] = dict.fromkeys(MODES, -math.inf)
        self._build_seconds: dict[str, float] = dict.fromkeys(MODES, 0.0)  # what making one took lately
        self.misses: dict[str, int] = dict.fromkeys(MODES, 0)  # attempts that found no spare of their mode
        self.handed_out: dict[str, int] = dict.fromkeys(MODES, 0)
        self.made: dict[str, int] = dict.fromkeys(MODES, 0)
        self.let_go: dict[str, int] = dict.fromkeys(MODES, 0)  # made, and let go unused (the pool was too big)
        self.reused: dict[str, int] = dict.fromkeys(MODES, 0)  # handed out again to the organisation that used it
        self._lock = threading.Lock()
        self.wake = threading.Event()  # an attempt started: the pool may be short now
        self._closed = False
        self._abort = threading.Event()  # set at stop: the spare being made is given up
        self._building = threading.Lock()  # held while one is made
        self._summarized: tuple = ()
        self._summary_at = -math.inf
        if self.wanted:
            sweep(self.top)  # a previous server's
            self._announce()

    def _announce(self) -> None:
        """Say that this server takes namespaces back (``netns.POOL_FILE``: a shim hands one back only while
        the server that will hand it out again runs)."""
        self.top.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        tmp = self.top / f".{netns.POOL_FILE}.{pid}"
        tmp.write_text(json.dumps({"pid": pid, "ticks": netns.process_ticks(pid)}))
        tmp.replace(self.top / netns.POOL_FILE)

    @property
    def wanted(self) -> bool:
        """Does this machine make spares at all (job networks available, a pool size above 0)?"""
        return bool(self.modes) and self.high > 0

    def ready(self, mode: str) -> int:
        with self._lock:
            return len(self._ready[mode])

    def counters(self) -> dict[str, dict[str, int]]:
        """Per mode: handed_out, misses, made, let_go (since the server started), and ready now."""
        with self._lock:
            return {
                m: {
                    "handed_out": self.handed_out[m],
                    "misses": self.misses[m],
                    "made": self.made[m],
                    "let_go": self.let_go[m],
                    "reused": self.reused[m],
                    "ready": len(self._ready[m]),
                }
                for m in self.modes
            }

    def target(self, mode: str, now: float | None = None) -> int:
        """The spares of ``mode`` to keep now: the starts expected within the lead, within [min, max]."""
        now = time.monotonic() if now is None else now
        with self._lock:
            return self._target(mode, now)

    def _target(self, mode: str, now: float) -> int:
        starts = self._starts[mode]
        while starts and starts[0] < now - RATE_SECONDS:
            starts.popleft()
        lead = max(LEAD_SECONDS, 2 * self._build_seconds[mode])
        expected = math.ceil(len(starts) / RATE_SECONDS * lead)
        return min(self.high, max(self.low, expected))

    def take(self, config: dict[str, Any], org_id: str | None = None) -> bool:
        """Move a namespace to ``config["dir"]`` when one fits (its mode, the rules it was made with): one that
        ``org_id``'s attempts handed back first, else a spare; False: the attempt's shim makes its own. With
        ``org_id``, the attempt's last shim hands it back when it ends (``config["recycle"]``)."""
        mode = config.get("mode")
        if mode not in self.modes or not self.wanted:
            return False
        fits = netns.made_for(config)
        target = Path(config["dir"])
        if org_id:
            config["recycle"] = str(self.top / f"{USED}{mode}-{uuid.uuid4().hex[:12]}-{org_id}")
        with self._lock:
            now = time.monotonic()
            self._starts[mode].append(now)
            self._last_start[mode] = now
            self.wake.set()
            if org_id and self._reuse(mode, org_id, fits, target):
                self.handed_out[mode] += 1
                self.reused[mode] += 1
                return True
            ready = self._ready[mode]
            while ready:
                spare, made_for = ready.popleft()
                if made_for != fits:
                    netns.cleanup(str(spare))  # the rules changed since it was made
                    self.let_go[mode] += 1
                    continue
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    spare.rename(target)
                except OSError:
                    netns.cleanup(str(spare))
                    self.let_go[mode] += 1
                    continue
                self.handed_out[mode] += 1
                return True
            self.misses[mode] += 1
            missed = self.misses[mode]
        log.info("job network: no spare %s network was ready (%d so far): the attempt makes its own", mode, missed)
        return False

    def _reuse(self, mode: str, org_id: str, fits: dict[str, Any], target: Path) -> bool:
        """Move a namespace ``org_id``'s attempts handed back to ``target`` (called under the lock). One made with
        other rules, or whose pasta is gone, is removed."""
        for path in self._used(mode, org_id):
            try:
                made_for = json.loads((path / netns.MADE_FOR).read_text())
            except (OSError, ValueError):
                made_for = None
            alive = mode != "isolated" or netns.pasta_running(str(path))
            if made_for != fits or not alive or not os.path.ismount(path / "ns"):
                netns.cleanup(str(path))
                continue
            try:
                (path / netns.MADE_FOR).unlink()
                path.rename(target)
            except OSError:
                netns.cleanup(str(path))
                continue
            return True
        return False

    def _used(self, mode: str, org_id: str | None = None) -> list[Path]:
        """The namespaces of ``mode`` handed back (by ``org_id``'s attempts), the longest-waiting first."""
        prefix = f"{USED}{mode}-"
        try:
            entries = list(os.scandir(self.top))
        except FileNotFoundError:
            return []
        aged = []
        for entry in entries:
            if not entry.name.startswith(prefix) or (org_id is not None and _org(entry.name) != org_id):
                continue
            with contextlib.suppress(OSError):
                aged.append((entry.stat(follow_symlinks=False).st_ctime, entry.path))
        return [Path(path) for _, path in sorted(aged)]

    def fill_once(self) -> float | None:
        """One step of the background task: make one spare for the mode furthest below its target, or let go of
        one beyond it. 0: step again at once; None: wait for a start (or the task's interval)."""
        now = time.monotonic()
        with self._lock:
            if self._closed:
                return None
            used = {m: self._used(m) for m in self.modes}
            for m in self.modes:  # never more than the pool's maximum kept per mode: the longest-waiting go first
                while len(used[m]) > self.high:
                    netns.cleanup(str(used[m].pop(0)))
            short = {m: self._target(m, now) - len(self._ready[m]) - len(used[m]) for m in self.modes}
            mode = max(self.modes, key=lambda m: short[m])
            if short[mode] <= 0:
                return self._trim(short, used, now)
        made = self._make(mode)
        if made is None:
            return None if self._closed else FAILED_SECONDS
        with self._lock:
            if self._closed:
                netns.cleanup(str(made[0]))
                return None
            self._ready[mode].append(made)
            self.made[mode] += 1
        return 0.0

    def _trim(self, short: dict[str, int], used: dict[str, list[Path]], now: float) -> float | None:
        """Nothing to make (called under the lock): let go of one namespace beyond its mode's target (one handed
        back first, the longest-waiting) once the mode has had no start for WINDOW_SECONDS; else say when to look
        again, and log the counters after a burst."""
        for m in self.modes:
            if short[m] < 0 and now - self._last_start[m] >= WINDOW_SECONDS:
                if used[m]:
                    netns.cleanup(str(used[m][0]))
                else:
                    spare, _ = self._ready[m].pop()  # the newest: the oldest go out first
                    netns.cleanup(str(spare))
                    self.let_go[m] += 1
                return TRIM_SECONDS
        summary = self._summary(now)
        if summary:
            log.info("job network pool: %s", summary)
        kept = [WINDOW_SECONDS - (now - self._last_start[m]) for m in self.modes if short[m] < 0]
        return max(TRIM_SECONDS, min(kept)) if kept else None

    def _summary(self, now: float) -> str | None:
        """The counters, when they changed and the last summary is old enough (called under the lock)."""
        counts = tuple(
            (self.handed_out[m], self.misses[m], self.made[m], self.let_go[m], self.reused[m]) for m in self.modes
        )
        if counts == self._summarized or now - self._summary_at < SUMMARY_SECONDS:
            return None
        self._summarized, self._summary_at = counts, now
        return _describe(self.modes, counts)

    def _make(self, mode: str) -> tuple[Path, dict[str, Any]] | None:
        name = f"{mode}-{uuid.uuid4().hex[:12]}"
        making, spare = self.top / f"making-{name}", self.top / f"spare-{name}"
        config = attempt_network(self.networking, self.settings, mode, "spare", 0)
        assert config is not None
        config.pop("api", None)  # a spare holds no listener: the attempt's shims open theirs
        config["dir"] = str(making)
        config["background"] = True
        with self._building:
            if self._closed:
                return None
            started = time.monotonic()
            try:
                net = netns.JobNetwork(config, abort=self._abort)
                try:
                    net.acquire("spare")
                finally:
                    net.close()
                (making / "users" / "spare").unlink()
                making.rename(spare)
            except (netns.NetworkError, OSError) as exc:
                netns.cleanup(str(making))
                if self._closed:
                    return None
                log.warning(
                    "job network: a spare %s network could not be made (%s); attempts make their own", mode, exc
                )
                return None
            took = time.monotonic() - started
        with self._lock:
            previous = self._build_seconds[mode]
            self._build_seconds[mode] = took if not previous else 0.7 * previous + 0.3 * took
        return spare, netns.made_for(config)

    def close(self) -> None:
        """Stop: the spare being made is given up, and every spare removed (its pasta with it)."""
        with contextlib.suppress(FileNotFoundError):  # first: no shim hands a namespace back from now on
            (self.top / netns.POOL_FILE).unlink()
        with self._lock:
            self._closed = True
            self._abort.set()
            for ready in self._ready.values():
                for spare, _ in ready:
                    netns.cleanup(str(spare))
                ready.clear()
            counts = tuple(
                (self.handed_out[m], self.misses[m], self.made[m], self.let_go[m], self.reused[m]) for m in self.modes
            )
        got = self._building.acquire(timeout=STOP_WAIT_SECONDS)
        try:
            if self.wanted:
                sweep(self.top)
        finally:
            if got:
                self._building.release()
        if self.wanted and any(any(c) for c in counts):
            log.info("job network pool at stop: %s", _describe(self.modes, counts))


def _describe(modes: tuple[str, ...], counts: tuple) -> str:
    return "; ".join(
        f"{m}: {handed} handed out, {missed} missed (made their own), {made} made, {gone} let go unused, "
        f"{reused} handed out again"
        for m, (handed, missed, made, gone, reused) in zip(modes, counts, strict=True)
    )


def sweep(top: Path) -> None:
    """Remove the pool's spares under ``top`` (``<run dir>/net``), finished or not, and stop their pastas, pid file
    or none (one killed before it was ready has none). An attempt's network (``<job>-<attempt>``) is never
    touched: its job may still run, under a server started again."""
    if not top.is_dir():
        return
    for path in top.iterdir():
        if path.name.startswith(PREFIXES):
            netns.cleanup(str(path))
    prefixes = tuple(f"{top / p}" for p in PREFIXES)
    for proc in psutil.process_iter(["name", "cmdline"]):
        try:
            if not (proc.info["name"] or "").startswith(("pasta", "passt")):
                continue
            argv = proc.info["cmdline"] or []
            where = argv[argv.index("--netns") + 1] if "--netns" in argv[:-1] else ""
            if where.startswith(prefixes):
                proc.terminate()
        except (psutil.Error, ValueError):
            continue


def _org(name: str) -> str:
    """The organisation a namespace handed back belongs to, from its name (used-<mode>-<hex>-<organisation>)."""
    parts = name.split("-", 3)
    return parts[3] if len(parts) == 4 else ""
