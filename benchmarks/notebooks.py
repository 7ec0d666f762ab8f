"""Notebooks: how long a notebook takes to its first kernel reply, against JupyterLab started by hand, and what
Kiln's proxy adds to each kernel message's round trip.

    .venv/bin/python benchmarks/notebooks.py [--rounds 3] [--messages 300] [--json PATH]

One fresh ``kiln server`` (``tests.kilnserver.KilnServer``, ``KILN_CPUS=8``, the production reconcile interval). A
warm-up notebook first builds the python runtime's ``+lab`` variant if ``.cache/test-runtimes`` lacks it (not
timed); then:

1. create → first kernel reply   ``--rounds`` times: ``create_notebook`` (idle timeout 0), wait for RUNNING, a
   kernel created through the proxy, its channels opened through the proxy, ``execute_request`` of ``1 + 1``,
   until its ``execute_reply``; then the notebook is deleted. Baseline, in the same rounds: the same
   ``python -m jupyterlab`` (the same runtime's Python, on a Unix socket with a token) started by hand, polled
   until it answers, a kernel created and its channels opened over the socket, the same execute, until the reply;
   then stopped. Target: the median of Kiln's ≤ 1.5x the median of by hand.
2. round trip                    ``--messages`` ``kernel_info_request`` → ``kernel_info_reply`` one after another
   on one kernel of the last notebook: through Kiln's proxy (a WebSocket to the server) and directly over the
   notebook's socket (the proxy's own path to it, as root beside the server), after a warm-up of 20 each.
   Target: p50 added (through the proxy - direct) ≤ 1 ms.

The machine is shared and small: the figures are ratios within one run, nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO))

from report import finish, parse_args, pct, print_table  # noqa: E402
from tests.kilnserver import TEST_RUNTIMES, KilnServer  # noqa: E402
from websockets.sync.client import ClientConnection, connect, unix_connect  # noqa: E402

from kiln.sdk.client import Client  # noqa: E402

LAB = TEST_RUNTIMES / "python-3+lab" / "bin" / "python"
START_TIMEOUT = 900.0


def _message(msg_type: str, content: dict[str, Any]) -> tuple[str, str]:
    msg_id = uuid.uuid4().hex
    header = {"msg_id": msg_id, "username": "bench", "session": "bench", "msg_type": msg_type, "version": "5.3"}
    body = {"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}
    return msg_id, json.dumps(body)


def _reply(ws: ClientConnection, msg_id: str, kind: str, timeout: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        msg = json.loads(ws.recv(timeout=max(0.01, deadline - time.monotonic())))
        if msg.get("parent_header", {}).get("msg_id") == msg_id and msg["header"]["msg_type"] == kind:
            return msg  # type: ignore[no-any-return]


def _execute(ws: ClientConnection, code: str) -> None:
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    msg_id, text = _message("execute_request", content)
    ws.send(text)
    reply = _reply(ws, msg_id, "execute_reply")
    assert reply["content"]["status"] == "ok", reply["content"]


def round_trips(ws: ClientConnection, count: int) -> list[float]:
    """Seconds of each kernel_info_request → kernel_info_reply, one after another."""
    times = []
    for _ in range(count):
        msg_id, text = _message("kernel_info_request", {})
        started = time.perf_counter()
        ws.send(text)
        _reply(ws, msg_id, "kernel_info_reply")
        times.append(time.perf_counter() - started)
    return times


# ---- through Kiln


def kiln_first_reply(client: Client, server: KilnServer, name: str) -> tuple[float, str]:
    """Seconds from create to the first execute_reply through the proxy; the notebook's id."""
    started = time.monotonic()
    notebook = client.create_notebook({"name": name, "runtime": {"framework": "python"}, "idle_timeout": 0})
    ready = client.wait_notebook(notebook.id, timeout=START_TIMEOUT)
    if ready.state != "RUNNING":
        raise SystemExit(f"notebook {name} is {ready.state}: {ready.message}")
    kernel = client.notebook_request(notebook.id, "POST", "api/kernels", json_body={"name": "python3"}).json()["id"]
    with _proxy_channels(client, server, notebook.id, kernel) as ws:
        _execute(ws, "1 + 1")
    return time.monotonic() - started, notebook.id


def _proxy_channels(client: Client, server: KilnServer, notebook_id: str, kernel: str) -> ClientConnection:
    subpath = f"api/kernels/{kernel}/channels"
    headers = client.notebook_websocket_headers(notebook_id, subpath)
    return connect(f"ws://127.0.0.1:{server.port}/notebooks/{notebook_id}/{subpath}", additional_headers=headers)


# ---- by hand


def by_hand_first_reply(python: Path, workdir: Path) -> float:
    """Seconds from starting ``python -m jupyterlab`` on a Unix socket to the first execute_reply over it."""
    token = secrets.token_urlsafe(32)
    workdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HOME": str(workdir), "JUPYTER_RUNTIME_DIR": str(workdir / "runtime")}
    started = time.monotonic()
    lab = subprocess.Popen(
        [
            str(python),
            "-m",
            "jupyterlab",
            "--no-browser",
            "--ServerApp.sock=lab.sock",
            "--ServerApp.sock_mode=0600",
            f"--IdentityProvider.token={token}",
            f"--ServerApp.root_dir={workdir}",
            "--LabApp.news_url=None",
            "--ServerApp.allow_remote_access=True",  # as the launcher does: a Host of the socket's choosing
            *(["--ServerApp.allow_root=True"] if os.geteuid() == 0 else []),  # as the launcher does
        ],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        sock = workdir / "lab.sock"
        headers = {"Authorization": f"token {token}"}
        with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), timeout=10) as http:
            while True:
                try:
                    if http.get("http://lab/api/status", headers=headers).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if lab.poll() is not None:
                    raise SystemExit(f"jupyterlab exited with {lab.returncode}")
                if time.monotonic() - started > START_TIMEOUT:
                    raise SystemExit(f"jupyterlab by hand did not answer within {START_TIMEOUT:g} s")
                time.sleep(0.05)
            kernel = http.post("http://lab/api/kernels", headers=headers, json={"name": "python3"}).json()["id"]
        with unix_connect(str(sock), uri=f"ws://lab/api/kernels/{kernel}/channels", additional_headers=headers) as ws:
            _execute(ws, "1 + 1")
        return time.monotonic() - started
    finally:
        lab.send_signal(signal.SIGTERM)
        try:
            lab.wait(15)
        except subprocess.TimeoutExpired:
            lab.kill()


def direct_channels(server: KilnServer, client: Client, notebook_id: str, kernel: str) -> ClientConnection:
    """The kernel's channels over the notebook's own socket, as the proxy reaches it (root, beside the server)."""
    job_id = client.get_notebook(notebook_id).job_id
    work = server.home / "jobs" / str(job_id) / "work"
    state = json.loads((work / ".kiln-notebook.json").read_text())
    headers = {"Authorization": f"token {state['token']}"}
    uri = f"ws://lab/notebooks/{notebook_id}/api/kernels/{kernel}/channels"
    return unix_connect(str(work / state["socket"]), uri=uri, additional_headers=headers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--messages", type=int, default=300)
    parser.add_argument("--json", type=Path)
    args = parse_args(parser, {"rounds": 1, "messages": 20})
    began = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="kiln-bench-notebooks-"))
    server = KilnServer(tmp / "home", cpus="8", reconcile_interval="0.5").start()
    client = server.client()
    try:
        warm, warm_id = kiln_first_reply(client, server, "warm-up")  # builds python-3+lab if it is not built
        print(f"warm-up notebook: {warm:.1f} s to its first reply (the runtime built if it was not)")
        client.delete_notebook(warm_id)
        kiln_times: list[float] = []
        hand_times: list[float] = []
        last_id = ""
        for n in range(args.rounds):
            hand_times.append(by_hand_first_reply(LAB, tmp / f"by-hand-{n}"))
            took, last_id = kiln_first_reply(client, server, f"bench-{n}")
            kiln_times.append(took)
            print(f"round {n + 1}: by hand {hand_times[-1]:.2f} s, Kiln {took:.2f} s")
            if n < args.rounds - 1:
                client.delete_notebook(last_id)
        kernel = client.notebook_request(last_id, "POST", "api/kernels", json_body={"name": "python3"}).json()["id"]
        with _proxy_channels(client, server, last_id, kernel) as ws:
            round_trips(ws, 20)
            proxied = round_trips(ws, args.messages)
        with direct_channels(server, client, last_id, kernel) as ws:
            round_trips(ws, 20)
            direct = round_trips(ws, args.messages)
        client.delete_notebook(last_id)
    finally:
        client.close()
        server.stop()
    kiln_med, hand_med = statistics.median(kiln_times), statistics.median(hand_times)
    p50_proxied, p50_direct = pct(proxied, 50), pct(direct, 50)
    added_p50 = p50_proxied - p50_direct
    rows = [
        {
            "metric": "create -> first kernel reply (median)",
            "value": kiln_med,
            "baseline": hand_med,
            "ratio": kiln_med / hand_med,
            "target": "<= 1.5x",
            "pass": kiln_med <= 1.5 * hand_med,
            "unit": "s",
        },
        {
            "metric": "kernel message round trip p50",
            "value": p50_proxied,
            "baseline": p50_direct,
            "ratio": p50_proxied / p50_direct,
            "target": "added <= 1 ms",
            "pass": added_p50 <= 0.001,
            "unit": "ms",
        },
        {
            "metric": "kernel message round trip p99",
            "value": pct(proxied, 99),
            "baseline": pct(direct, 99),
            "ratio": pct(proxied, 99) / pct(direct, 99),
            "target": "-",
            "pass": None,
            "unit": "ms",
        },
    ]
    print(f"the proxy adds {added_p50 * 1000:.3f} ms to a kernel message's round trip at p50")
    print_table(rows, digits={"ms": 3})
    results = {
        "kiln_seconds": kiln_times,
        "by_hand_seconds": hand_times,
        "round_trip_proxied_s": proxied,
        "round_trip_direct_s": direct,
        "added_p50_s": added_p50,
    }
    finish(results, rows, began, args.json)


if __name__ == "__main__":
    main()
