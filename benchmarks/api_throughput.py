"""Throughput and latency of a signed GET /api/v1/jobs?limit=20 against a bare FastAPI JSON route.

    .venv/bin/python benchmarks/api_throughput.py [--duration 10] [--warmup 2] [--concurrency 8 32] [--json PATH]

What it measures, all in one run on this machine (the figures that matter are ratios within the run):

1. baseline  a bare FastAPI app (a subprocess of this script) with one sync route returning the very JSON document
             Kiln returned for GET /api/v1/jobs?limit=20 (same bytes on the wire, from plain dicts), served by
             uvicorn with Kiln's options (one process, access log off, same log level).
2. kiln      a real ``kiln server`` (``tests.kilnserver.KilnServer``, rate limit off) holding 25 finished jobs:
             GET /api/v1/jobs?limit=20, every request signed with its own nonce (the server refuses replays). The
             signed requests are prepared before the timed phase, so the client's HMAC is not measured.
   Target: kiln requests/s >= 0.5x the baseline's, at each concurrency.
3. breakdown (at the first concurrency) bare ``/tiny`` (a one-key JSON), Kiln ``/healthz`` (not authenticated) and
             signed ``/api/v1/whoami`` (signature check and nonce insert, no query): the differences in server CPU
             per request between these and the two routes above say where Kiln's time goes.
4. profile   only with ``--py-spy PATH``: one more Kiln phase with py-spy attached (``--gil``); the samples are
             grouped by component (auth, list query, to_read, thread-pool hand-offs, ...).

The load generator is a small keep-alive HTTP/1.1 client on raw asyncio streams, cheaper per request than httpx so
that on 2 CPUs it takes little CPU from the server. It runs in its own process, one per phase, with N connections,
each sending its next request as soon as the previous response is read (closed loop). Requests/s counts 200
responses completed inside the timed window (after the warm-up); latency is per request, from the write to the
last body byte. Server CPU per request is the server process's CPU time over the window (psutil) divided by the
requests: unlike requests/s it does not depend on how much CPU the client took. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from report import finish, fresh_database, parse_args, print_table, summary  # noqa: E402

PY = sys.executable  # a resolved interpreter: `python3` on PATH may be a slow pyenv shim
HOST = "127.0.0.1"
JOBS_PATH, JOBS_QUERY = "/api/v1/jobs", "limit=20"
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}
MIN_REQUESTS = 10  # answers a phase waits for past its window, if it has fewer: a phase with none has no figures
MAX_SIGNATURE_AGE = 240.0  # seconds; the server accepts X-Kiln-Date within clock_skew_seconds (300) of now


# -- the bare baseline server (run as `api_throughput.py _bare PORT PAYLOAD_FILE sync|async`) ----------


def serve_bare(port: int, payload_file: Path, mode: str) -> None:
    import uvicorn
    from fastapi import FastAPI

    payload = json.loads(payload_file.read_text())
    app = FastAPI()

    if mode == "async":

        @app.get("/items")
        async def items_async() -> dict[str, Any]:
            return payload  # type: ignore[no-any-return]

        @app.get("/tiny")
        async def tiny_async() -> dict[str, str]:
            return {"status": "ok"}

    else:  # sync, like Kiln's routes: FastAPI runs them (and their response validation) in its thread pool

        @app.get("/items")
        def items() -> dict[str, Any]:
            return payload  # type: ignore[no-any-return]

        @app.get("/tiny")
        def tiny() -> dict[str, str]:
            return {"status": "ok"}

    # The options of kiln.api.serve.serve: one process, access log off, same log level.
    uvicorn.run(app, host=HOST, port=port, log_level="info", access_log=False, timeout_graceful_shutdown=5)


class BareServer:
    def __init__(self, tmp: Path, payload: Any, mode: str) -> None:
        from tests.kilnserver import free_port

        self.port = free_port()
        self.mode = mode
        self.payload_file = tmp / "bare-payload.json"
        self.payload_file.write_text(json.dumps(payload))
        self.log_path = tmp / "bare-server.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self, timeout: float = 30) -> BareServer:
        import httpx

        argv = [PY, __file__, "_bare", str(self.port), str(self.payload_file), self.mode]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"bare server exited: {self.log()}")
            try:
                if httpx.get(self.url + "/tiny", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"bare server not ready after {timeout}s: {self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# -- the load generator (run as `api_throughput.py _load SPEC OUT`, one process per phase) -------------


def request_bytes(spec: dict[str, Any], headers: dict[str, str]) -> bytes:
    target = spec["path"] + (f"?{spec['query']}" if spec["query"] else "")
    lines = [f"GET {target} HTTP/1.1", f"Host: {HOST}:{spec['port']}", "User-Agent: kiln-bench", "Accept: */*"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def signer(spec: dict[str, Any]) -> Callable[[], bytes]:
    """A function returning one freshly signed request (new nonce, current date), as the SDK signs it."""
    from kiln.auth import signing

    empty = signing.body_sha256(b"")

    def one() -> bytes:
        headers = signing.sign_headers(
            access_key=spec["access_key"],
            secret_key=spec["secret_key"],
            method="GET",
            path=spec["path"],
            query=spec["query"],
            content_sha256=empty,
        )
        return request_bytes(spec, headers)

    return one


async def read_response(reader: asyncio.StreamReader) -> tuple[int, int]:
    """(status, body length) of one HTTP/1.1 response; Content-Length or chunked."""
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    lower = head.lower()
    at = lower.find(b"\r\ncontent-length:")
    if at >= 0:
        end = lower.index(b"\r\n", at + 2)
        length = int(head[at + 17 : end])
        await reader.readexactly(length)
        return status, length
    if b"transfer-encoding: chunked" in lower:
        total = 0
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            await reader.readexactly(size + 2)
            total += size
            if size == 0:
                return status, total
    return status, 0


def cpu_seconds(before: Any, after: Any) -> float:
    return float((after.user + after.system) - (before.user + before.system))


async def load(spec: dict[str, Any]) -> dict[str, Any]:
    import psutil

    sign_one = signer(spec)
    fixed = sign_one()  # unsigned routes get the same header bytes (they ignore them)
    pool: collections.deque[bytes] = collections.deque()
    t0 = time.perf_counter()
    if spec["sign"]:
        pool.extend(sign_one() for _ in range(spec["pool"]))
    pool_built, pool_s = time.perf_counter(), time.perf_counter() - t0
    signed_live = 0

    def next_request() -> bytes:
        nonlocal signed_live
        if not spec["sign"]:
            return fixed
        if pool and time.perf_counter() - pool_built < MAX_SIGNATURE_AGE:
            return pool.popleft()
        signed_live += 1  # pool used up (or its dates too old): signed inside the timed phase (reported)
        return sign_one()

    # ``ports``/``server_pids`` (benchmarks/failover.py): the connections spread over several servers, round robin,
    # and their CPU summed; else the one ``port``/``server_pid``.
    ports = spec.get("ports") or [spec["port"]]
    servers = [psutil.Process(pid) for pid in spec.get("server_pids") or [spec["server_pid"]]]
    me = psutil.Process()
    conns = [
        (await asyncio.open_connection(HOST, ports[i % len(ports)]), ports[i % len(ports)])
        for i in range(spec["concurrency"])
    ]
    start = time.perf_counter()
    warm_end = start + spec["warmup"]
    end = warm_end + spec["duration"]
    latencies: list[float] = []
    statuses: collections.Counter[int] = collections.Counter()
    body_bytes = 0
    conn_errors = 0
    marks: dict[str, Any] = {}

    async def sampler() -> None:
        await asyncio.sleep(max(0.0, warm_end - time.perf_counter()))
        marks["t0"], marks["srv0"], marks["me0"] = time.perf_counter(), [x.cpu_times() for x in servers], me.cpu_times()
        await asyncio.sleep(max(0.0, end - time.perf_counter()))
        if len(latencies) >= MIN_REQUESTS:
            marks["t1"], marks["srv1"] = time.perf_counter(), [x.cpu_times() for x in servers]
            marks["me1"] = me.cpu_times()

    async def worker(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], port: int) -> None:
        nonlocal body_bytes, conn_errors
        reader, writer = conn
        perf = time.perf_counter
        while True:
            t0 = perf()
            if t0 >= end and len(latencies) >= MIN_REQUESTS:
                break
            writer.write(next_request())
            try:
                status, length = await read_response(reader)
            except (asyncio.IncompleteReadError, ConnectionError, ValueError):
                conn_errors += 1
                writer.close()
                reader, writer = await asyncio.open_connection(HOST, port)
                continue
            t1 = perf()
            if warm_end <= t1 and (t1 < end or len(latencies) < MIN_REQUESTS):
                latencies.append(t1 - t0)
                statuses[status] += 1
                body_bytes += length
        writer.close()

    await asyncio.gather(sampler(), *(worker(conn, port) for conn, port in conns))
    if "t1" not in marks:  # the window stretched until MIN_REQUESTS answers were in
        marks["t1"], marks["srv1"] = time.perf_counter(), [x.cpu_times() for x in servers]
        marks["me1"] = me.cpu_times()
    window = marks["t1"] - marks["t0"]
    server_cpu = sum(cpu_seconds(a, b) for a, b in zip(marks["srv0"], marks["srv1"], strict=True))
    ok = statuses.get(200, 0)
    return {
        "window_s": window,
        "requests": len(latencies),
        "ok": ok,
        "rps": ok / window,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "conn_errors": conn_errors,
        "latency": summary(latencies),
        "body_bytes_mean": body_bytes / len(latencies) if latencies else 0,
        "server_cpu_s": server_cpu,
        "server_cpu_ms_per_req": 1000 * server_cpu / ok if ok else None,
        "server_cpu_percent": 100 * server_cpu / window,
        "server_cpu_percent_each": [
            100 * cpu_seconds(a, b) / window for a, b in zip(marks["srv0"], marks["srv1"], strict=True)
        ],
        "client_cpu_percent": 100 * cpu_seconds(marks["me0"], marks["me1"]) / window,
        "pool": spec["pool"] if spec["sign"] else 0,
        "pool_build_s": pool_s,
        "signed_live": signed_live,
    }


def run_phase(tmp: Path, key: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    spec_file, out_file = tmp / f"load-{key}.json", tmp / f"load-{key}.out.json"
    spec_file.write_text(json.dumps(spec))
    spec_file.chmod(0o600)  # it holds the test server's secret key
    budget = spec["warmup"] + spec["duration"] + 60
    subprocess.run([PY, __file__, "_load", str(spec_file), str(out_file)], check=True, timeout=budget)
    result: dict[str, Any] = json.loads(out_file.read_text())
    result["name"] = name
    return result


# -- Kiln set-up --------------------------------------------------------------------------------------


def seed_jobs(client: Any, n: int, timeout: float = 60) -> list[str]:
    """Submit n quick jobs (`true`) and wait until they ended."""
    spec = {"command": ["true"], "runtime": {"python": PY}, "resources": {"cpus": 1}}
    ids = [client.submit(spec).id for _ in range(n)]
    deadline = time.monotonic() + timeout
    pending = set(ids)
    while pending and time.monotonic() < deadline:
        pending = {j for j in pending if str(client.get_job(j).state) not in TERMINAL}
        if pending:
            time.sleep(0.2)
    if pending:
        print(f"  warning: {len(pending)} seed job(s) not finished after {timeout:.0f}s", file=sys.stderr)
    return ids


# -- py-spy -------------------------------------------------------------------------------------------

# Each sample (a stack of the thread holding the GIL) goes to the deepest frame that matches one of these, looked
# for from the leaf up: the component whose own code, or callees not listed here, held the GIL.
BUCKETS: list[tuple[str, tuple[str, ...]]] = [
    ("to_read: JobRead + JobSpec per row", ("to_read (",)),
    ("JobService.list_jobs: ORM query, rows", ("JobService.list_jobs (",)),
    ("IdentityService.authenticate: nonce txn, HMAC", ("IdentityService.authenticate (",)),
    ("response: model_response / response model", ("model_response (", "serialize_response (")),
    ("Kiln route functions (kiln/api/routers)", ("kiln/api/routers/",)),
    ("FastAPI dependencies (kiln/api/deps.py)", ("solve_dependencies (",)),
    ("SignatureMiddleware own code", ("kiln/api/auth.py",)),
    (
        "thread-pool hand-offs (anyio)",
        ("run_sync_in_worker_thread", "WorkerThread.run", "run_in_threadpool", "call_soon_threadsafe"),
    ),
    (
        "Starlette/FastAPI routing, middleware",
        ("Router.__call__", "APIRoute.handle", "get_request_handler", "request_response.", "Starlette.__call__"),
    ),
    ("uvicorn + h11 (HTTP parse/write)", ("uvicorn/protocols/", "h11/")),
    ("reconciler and executor threads", ("kiln/scheduler/", "kiln/backends/")),
    ("asyncio event loop", ("asyncio/", "selectors.py")),
]


def short_frame(frame: str) -> str:
    """``func (path/file.py:123)`` → ``func (file.py)``."""
    name, _, where = frame.partition(" (")
    return f"{name} ({where.split(':')[0].rsplit('/', 1)[-1]})"


def profile_summary(raw: Path, top: int = 20) -> dict[str, Any]:
    """Share of py-spy samples per component (BUCKETS) and per function, from collapsed stacks (``--format raw``)."""
    total = 0
    buckets: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    for line in raw.read_text(errors="replace").splitlines():
        stack, _, count_s = line.rpartition(" ")
        if not stack or not count_s.isdigit():
            continue
        count = int(count_s)
        total += count
        frames = stack.split(";")
        for frame in {short_frame(f) for f in frames}:
            inclusive[frame] += count
        own[short_frame(frames[-1])] += count
        for frame in reversed(frames):
            label = next((b for b, marks in BUCKETS if any(m in frame for m in marks)), None)
            if label:
                buckets[label] += count
                break
        else:
            buckets["other"] += count

    def share(count: int) -> float:
        return round(100 * count / total, 1) if total else 0.0

    return {
        "samples": total,
        "buckets_percent": [(b, share(buckets[b])) for b in [*(b for b, _ in BUCKETS), "other"] if buckets[b]],
        "inclusive_percent": [(f, share(c)) for f, c in inclusive.most_common(top)],
        "self_percent": [(f, share(c)) for f, c in own.most_common(top)],
    }


def run_profiled(tmp: Path, py_spy: str, spec: dict[str, Any], out_dir: Path, name: str) -> dict[str, Any]:
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / "kiln-jobs.pyspy.txt"
    seconds = spec["warmup"] + spec["duration"]
    argv = [py_spy, "record", "--pid", str(spec["server_pid"]), "--gil", "--rate", "200"]
    argv += ["--format", "raw", "-o", str(raw), "--duration", str(math.ceil(seconds))]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)  # attached before the load starts
    result = run_phase(tmp, "kiln-jobs-pyspy", name, spec)
    try:
        _, err = spy.communicate(timeout=seconds + 30)
    except subprocess.TimeoutExpired:
        spy.kill()
        _, err = spy.communicate()
    if raw.exists():
        result["profile"] = profile_summary(raw)
        result["profile"]["collapsed_stacks"] = str(raw)
    else:
        print(f"  py-spy wrote nothing: {err.decode(errors='replace')[-500:]}", file=sys.stderr)
    return result


# -- report -------------------------------------------------------------------------------------------


def fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.2f} ms"


def print_phase(r: dict[str, Any]) -> None:
    lat = r["latency"]
    cpu_req = r["server_cpu_ms_per_req"]
    cpu_s = "-" if cpu_req is None else f"{cpu_req:.3f}"
    line = (
        f"  {r['name']:28s} {r['rps']:7.0f} req/s  p50 {fmt_ms(lat.get('p50')):>9s}  p99 {fmt_ms(lat.get('p99')):>10s}"
        f"  server CPU {r['server_cpu_percent']:4.0f}% = {cpu_s} ms/req  client CPU {r['client_cpu_percent']:3.0f}%"
        f"  {r['body_bytes_mean']:.0f} B"
    )
    bad = {k: v for k, v in r["statuses"].items() if k != "200"}
    if bad:
        line += f"  NON-200: {bad}"
    if r["conn_errors"]:
        line += f"  connection errors: {r['conn_errors']}"
    if r["signed_live"]:
        line += f"  ({r['signed_live']} requests signed inside the window: raise --pool-rps)"
    print(line)


def print_profile(r: dict[str, Any]) -> None:
    prof = r["profile"]
    cpu = r["server_cpu_ms_per_req"] or 0.0
    print(f"  {prof['samples']} samples with the GIL held. Share per component (deepest matching frame), and that")
    print(f"  share of this phase's server CPU per request ({cpu:.3f} ms):")
    for label, share in prof["buckets_percent"]:
        print(f"    {share:5.1f}%  {cpu * share / 100:6.3f} ms  {label}")
    print("  self share per function (top):")
    for frame, share in prof["self_percent"][:12]:
        print(f"    {share:5.1f}%  {frame}")
    print(f"  collapsed stacks (for speedscope, flamegraph.pl): {prof['collapsed_stacks']}")


BREAKDOWN_STEPS = [
    ("bare /tiny", "bare_tiny", None, "FastAPI + uvicorn, tiny JSON (floor)"),
    ("bare /items", "bare_items", "bare_tiny", "+ the 20-job JSON from plain dicts"),
    ("kiln /healthz", "kiln_healthz", "bare_tiny", "Kiln app, no auth (vs bare /tiny)"),
    ("kiln /whoami", "kiln_whoami", "kiln_healthz", "+ signature check, nonce insert, deps"),
    ("kiln /jobs?limit=20", "kiln_jobs", "kiln_whoami", "+ list query, JobRead x20, JSON of the list"),
]


def breakdown_table(phases: dict[str, dict[str, Any]], c: int) -> dict[str, Any]:
    print(f"\nwhere Kiln's time goes (c={c}): server CPU and wall time (1/throughput) per request, and the step up")

    def per(key: str) -> tuple[float, float]:
        r = phases[key]
        return (r["server_cpu_ms_per_req"] or 0.0), (1000.0 / r["rps"] if r["rps"] else float("nan"))

    out = {}
    print(f"  {'route':22s} {'CPU/req':>10s} {'Δ CPU':>10s} {'wall/req':>10s} {'Δ wall':>10s}  step")
    for label, key, ref, what in BREAKDOWN_STEPS:
        cpu, wall = per(key)
        dcpu, dwall = (cpu - per(ref)[0], wall - per(ref)[1]) if ref else (None, None)
        out[key] = {"cpu_ms": cpu, "wall_ms": wall, "delta_cpu_ms": dcpu, "delta_wall_ms": dwall, "step": what}
        d1 = "-" if dcpu is None else f"{dcpu:+.3f}ms"
        d2 = "-" if dwall is None else f"{dwall:+.3f}ms"
        print(f"  {label:22s} {cpu:8.3f}ms {d1:>10s} {wall:8.3f}ms {d2:>10s}  {what}")
    return out


def row(metric: str, value: float, baseline: float | None, target: str, ok: bool | None, unit: str) -> dict:
    return {
        "metric": metric,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "ratio": (value / baseline) if baseline else None,
        "target": target,
        "pass": ok,
    }


def table_rows(main_phases: dict[int, dict[str, dict[str, Any]]]) -> list[dict]:
    rows = []
    for c, pair in main_phases.items():
        k, b = pair["kiln"], pair["bare"]
        ok = k["rps"] >= 0.5 * b["rps"]
        rows.append(row(f"GET /jobs?limit=20 throughput, c={c}", k["rps"], b["rps"], "≥ 0.5x", ok, "req/s"))
        for q in ("p50", "p99"):
            metric = f"GET /jobs?limit=20 latency {q}, c={c}"
            rows.append(row(metric, k["latency"][q], b["latency"][q], "(info)", None, "ms"))
        if k["server_cpu_ms_per_req"] and b["server_cpu_ms_per_req"]:
            kc, bc = k["server_cpu_ms_per_req"] / 1000, b["server_cpu_ms_per_req"] / 1000
            rows.append(row(f"server CPU per request, c={c}", kc, bc, "(info)", None, "ms"))
    return rows


# -- main ---------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=10.0, help="timed seconds per main phase (default 10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds before each phase (default 2)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32], help="connections (default: 8 32)")
    parser.add_argument("--breakdown-duration", type=float, default=5.0, help="timed s per breakdown phase (5)")
    parser.add_argument("--no-breakdown", action="store_true", help="skip the /tiny, /healthz, /whoami phases")
    parser.add_argument("--jobs", type=int, default=25, help="finished jobs in Kiln's database (default 25)")
    parser.add_argument("--bare-route", choices=["sync", "async"], default="sync", help="baseline route (sync)")
    parser.add_argument("--pool-rps", type=float, default=5000, help="signed requests prepared per phase second")
    parser.add_argument("--py-spy", metavar="PATH", help="py-spy binary: also profile one Kiln phase with it")
    parser.add_argument("--profile-dir", type=Path, help="where py-spy's collapsed stacks go (default: temp dir)")
    parser.add_argument("--postgres", metavar="URL", help="Kiln on a new PostgreSQL database next to URL's")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parse_args(
        parser,
        {"duration": 0.5, "warmup": 0.2, "concurrency": [2], "breakdown_duration": 0.3, "jobs": 2, "pool_rps": 400},
    )

    from tests.kilnserver import KilnServer

    started = time.monotonic()
    results: dict[str, Any] = {
        "python": PY,
        "cpus_on_machine": os.cpu_count(),
        "duration_s": args.duration,
        "warmup_s": args.warmup,
        "concurrency": args.concurrency,
        "bare_route": args.bare_route,
        "phases": [],
    }
    main_phases: dict[int, dict[str, dict[str, Any]]] = {}
    breakdown: dict[str, dict[str, Any]] = {}
    results["database"] = "PostgreSQL" if args.postgres else "SQLite"
    with (
        tempfile.TemporaryDirectory(prefix="kiln-bench-api-") as tmp_s,
        fresh_database(args.postgres, Path(tmp_s) / "unused.db") as url,
    ):
        tmp = Path(tmp_s)
        database_url = url if args.postgres else None  # SQLite: the home's own database (nonces in memory)
        kiln = KilnServer(tmp / "home", database_url, rate_limit_per_second="0", cpus="64", reconcile_interval="0.5")
        bare: BareServer | None = None
        client = None
        try:
            t0 = time.monotonic()
            kiln.start()
            client = kiln.client()
            up = time.monotonic() - t0
            print(f"kiln server up in {up:.1f}s at {kiln.url} ({results['database']}, rate limit off)")
            t0 = time.monotonic()
            seed_jobs(client, args.jobs)
            print(f"  {args.jobs} jobs `true` submitted and ended in {time.monotonic() - t0:.1f}s")
            payload = client.request("GET", "/jobs", params={"limit": 20}).json()
            results["items"] = len(payload["items"])
            bare = BareServer(tmp, payload, args.bare_route).start()
            print(f"bare FastAPI server up at {bare.url} ({args.bare_route} route, the same {results['items']} jobs)")
            creds = kiln.credentials()

            def spec(server: Any, path: str, query: str, c: int, duration: float, sign: bool) -> dict[str, Any]:
                return {
                    "access_key": creds["KILN_ACCESS_KEY"],
                    "secret_key": creds["KILN_SECRET_KEY"],
                    "port": server.port,
                    "server_pid": server.proc.pid,
                    "path": path,
                    "query": query,
                    "concurrency": c,
                    "warmup": args.warmup,
                    "duration": duration,
                    "sign": sign,
                    "pool": int(args.pool_rps * (args.warmup + duration)) if sign else 0,
                }

            def phase(key: str, name: str, sp: dict[str, Any]) -> dict[str, Any]:
                r = run_phase(tmp, key, name, sp)
                print_phase(r)
                if any(k != "200" for k in r["statuses"]):
                    print(f"    server log tail:\n{kiln.log()[-1500:]}", file=sys.stderr)
                results["phases"].append(r)
                return r

            for c in args.concurrency:
                print(f"\nconcurrency {c}: {args.warmup:g}s warm-up + {args.duration:g}s per phase")
                main_phases[c] = {
                    "bare": phase(
                        f"bare-items-{c}", f"bare /items c={c}", spec(bare, "/items", "", c, args.duration, False)
                    ),
                    "kiln": phase(
                        f"kiln-jobs-{c}",
                        f"kiln /jobs?limit=20 c={c}",
                        spec(kiln, JOBS_PATH, JOBS_QUERY, c, args.duration, True),
                    ),
                }

            c = args.concurrency[0]
            if not args.no_breakdown:
                d = args.breakdown_duration
                print(f"\nbreakdown at concurrency {c}: {args.warmup:g}s warm-up + {d:g}s per phase")
                breakdown = {
                    "bare_tiny": phase("bare-tiny", f"bare /tiny c={c}", spec(bare, "/tiny", "", c, d, False)),
                    "kiln_healthz": phase(
                        "kiln-healthz", f"kiln /healthz c={c}", spec(kiln, "/healthz", "", c, d, False)
                    ),
                    "kiln_whoami": phase(
                        "kiln-whoami", f"kiln /whoami (signed) c={c}", spec(kiln, "/api/v1/whoami", "", c, d, True)
                    ),
                    "bare_items": main_phases[c]["bare"],
                    "kiln_jobs": main_phases[c]["kiln"],
                }

            if args.py_spy:
                print(f"\npy-spy (--gil) on the kiln server, GET /jobs?limit=20 at c={c} (not used for the targets)")
                r = run_profiled(
                    tmp,
                    args.py_spy,
                    spec(kiln, JOBS_PATH, JOBS_QUERY, c, args.duration, True),
                    args.profile_dir or (tmp / "profile"),
                    f"kiln /jobs c={c} under py-spy",
                )
                print_phase(r)
                if "profile" in r:
                    results["profile"] = {**r["profile"], "server_cpu_ms_per_req": r["server_cpu_ms_per_req"]}
                    print_profile(r)
        finally:
            if client is not None:
                client.close()
            if bare is not None:
                bare.stop()
            kiln.stop()

    if breakdown:
        results["breakdown"] = breakdown_table(breakdown, args.concurrency[0])
    rows = table_rows(main_phases)
    print_table(rows, metric_width=48, digits={"req/s": 0, "ms": 2})
    print(
        f"baseline = a bare FastAPI {args.bare_route} route returning the same JSON (plain dicts), uvicorn with Kiln's "
        "options, same run, same\nload generator (own process, keep-alive connections, closed loop). Every Kiln "
        "request carries its own signature and nonce."
    )
    finish(results, rows, started, args.json)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["_bare"]:
        serve_bare(int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
    elif sys.argv[1:2] == ["_load"]:
        spec_in = json.loads(Path(sys.argv[2]).read_text())
        Path(sys.argv[3]).write_text(json.dumps(asyncio.run(load(spec_in))))
    else:
        sys.exit(main())
