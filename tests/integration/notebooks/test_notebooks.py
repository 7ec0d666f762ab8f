"""Notebooks end to end on the local executor: a real JupyterLab (the python runtime's +lab variant, built by the
first job that needs it) in a job's sandbox and network namespace, reached only through Kiln's proxy.

One server and one notebook for the module (a JupyterLab start is the slow part); the culling test starts a
second notebook with a short idle timeout.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import ClientConnection, connect

from kiln.errors import Conflict, Forbidden, NotFound
from kiln.sdk.client import Client
from tests.kilnserver import KilnServer
from tests.tenancy_helpers import Api, close_all, create_tenant

pytestmark = pytest.mark.slow

START_TIMEOUT = 420.0  # the first start builds the python runtime's +lab variant (pip install jupyterlab)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilnServer]:
    srv = KilnServer(tmp_path_factory.mktemp("notebooks") / "home", cpus="2").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def people(server: KilnServer) -> Iterator[dict[str, Client]]:
    """Two members of one organisation, and a member of another."""
    admin = Api.admin(server)
    labs, other = create_tenant(admin, "labs", ("admin", "member")), create_tenant(admin, "other", ("member",))
    clients = {
        "owner": Client(server.url, labs.accounts["member"].key_id, labs.accounts["member"].secret),
        "colleague": Client(server.url, labs.accounts["admin"].key_id, labs.accounts["admin"].secret),
        "stranger": Client(server.url, other.accounts["member"].key_id, other.accounts["member"].secret),
    }
    yield clients
    for client in clients.values():
        client.close()
    close_all(labs, other)
    admin.close()


@pytest.fixture(scope="module")
def notebook(people: dict[str, Client], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    owner = people["owner"]
    data = tmp_path_factory.mktemp("nbdata")
    (data / "hello.txt").write_text("a staged dataset\n")
    owner.put_dataset(data, "nbdata", state_dir=tmp_path_factory.mktemp("state"))
    created = owner.create_notebook(
        {"name": "explore", "runtime": {"framework": "python"}, "inputs": [{"dataset": "nbdata@1"}], "idle_timeout": 0}
    )
    assert created.state == "STARTING" and created.url.endswith(f"/notebooks/{created.id}/lab"), created
    ready = owner.wait_notebook("explore", timeout=START_TIMEOUT)
    assert ready.state == "RUNNING", (ready.state, ready.message)
    yield created.id
    owner.delete_notebook("explore")


def _kernel(client: Client, notebook_id: str) -> str:
    answer = client.notebook_request(notebook_id, "POST", "api/kernels", json_body={"name": "python3"})
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def _channels(client: Client, server: KilnServer, notebook_id: str, kernel: str) -> ClientConnection:
    subpath = f"api/kernels/{kernel}/channels"
    headers = client.notebook_websocket_headers(notebook_id, subpath)
    return connect(f"ws://127.0.0.1:{server.port}/notebooks/{notebook_id}/{subpath}", additional_headers=headers)


def _execute(ws: ClientConnection, code: str, timeout: float = 60.0) -> tuple[str, str]:
    """Run ``code`` on the kernel: (status of the reply, what it printed). The reply (shell channel) may come before
    the output (iopub): what it printed is complete once the kernel says, on iopub, that it is idle again."""
    session, msg_id = uuid.uuid4().hex, uuid.uuid4().hex
    header = {"msg_id": msg_id, "username": "test", "session": session, "msg_type": "execute_request", "version": "5.3"}
    content = {"code": code, "silent": False, "store_history": False, "user_expressions": {}, "allow_stdin": False}
    ws.send(json.dumps({"header": header, "parent_header": {}, "metadata": {}, "content": content, "channel": "shell"}))
    printed, deadline = [], time.monotonic() + timeout
    status, idle = None, False
    while time.monotonic() < deadline and (status is None or not idle):
        msg = json.loads(ws.recv(timeout=deadline - time.monotonic()))
        if msg.get("parent_header", {}).get("msg_id") != msg_id:
            continue
        kind = msg["header"]["msg_type"]
        if kind == "stream":
            printed.append(msg["content"]["text"])
        elif kind == "error":
            printed.append("\n".join(msg["content"]["traceback"]))
        elif kind == "execute_reply":
            status = str(msg["content"]["status"])
        elif kind == "status" and msg["content"].get("execution_state") == "idle":
            idle = True
    if status is None or not idle:
        raise AssertionError(f"no reply to {code!r} within {timeout}s; printed {printed}")
    return status, "".join(printed)


@pytest.mark.needs("chromium")
@pytest.mark.timeout(400)
def test_the_console_lists_the_notebook_and_opens_it_in_chromium_to_run_a_cell(
    server: KilnServer, people: dict[str, Client], notebook: str
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser import launch

    owner = people["owner"]
    wait_ms = 60_000  # JupyterLab's first load on a loaded 2-CPU machine
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            context.set_default_timeout(wait_ms)
            page = context.new_page()
            page.goto(server.url + "/notebooks")  # signed out: the console's sign-in, then back here
            page.get_by_label("Access key id").fill(owner.access_key or "")
            page.get_by_label("Secret key").fill(owner._secret_key or "")
            page.get_by_role("button", name="Sign in").click()
            row = page.get_by_test_id("notebook-row").filter(has_text="explore")
            expect(row).to_contain_text("RUNNING")
            with context.expect_page() as opened:
                row.get_by_test_id("open-notebook").click()
            lab = opened.value
            expect(lab).to_have_url(f"{server.url}/notebooks/{notebook}/lab", timeout=wait_ms)
            # A new notebook from the launcher: once its kernel's channels are open (a WebSocket through the proxy;
            # JupyterLab shows the kernel idle before that, and a cell run earlier is dropped), a cell typed and run.
            with lab.expect_websocket(lambda ws: "/channels" in ws.url, timeout=wait_ms):
                lab.locator('.jp-LauncherCard[data-category="Notebook"]').first.click()
            expect(lab.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')).to_have_count(1)
            cell = lab.locator(".jp-Notebook .jp-Cell .cm-content").first
            cell.click()
            lab.keyboard.type("print(6 * 7)")
            expect(cell).to_contain_text("print(6 * 7)")
            lab.keyboard.press("Shift+Enter")
            expect(lab.locator(".jp-OutputArea-output").first).to_contain_text("42", timeout=wait_ms)
        finally:
            browser.close()
    names = [item["name"] for item in owner.notebook_request(notebook, "GET", "api/contents").json()["content"]]
    saved = [name for name in names if name.endswith(".ipynb") and name != "Welcome to Kiln.ipynb"]
    assert saved, names  # the page saved its notebook into the home


@pytest.mark.timeout(300)
def test_the_notebook_says_what_persists_in_its_welcome_notebook_and_each_terminal(
    server: KilnServer, people: dict[str, Client], notebook: str
) -> None:
    owner = people["owner"]
    welcome = owner.notebook_request(notebook, "GET", "api/contents/Welcome%20to%20Kiln.ipynb?content=1")
    assert welcome.status_code == 200, welcome.text
    first = "".join(welcome.json()["content"]["cells"][0]["source"])
    assert "persist" in first and "gone when the notebook stops" in first, first
    made = owner.notebook_request(notebook, "POST", "api/terminals")
    assert made.status_code == 200, made.text
    name = made.json()["name"]
    subpath = f"terminals/websocket/{name}"
    headers = owner.notebook_websocket_headers(notebook, subpath)
    printed = ""
    try:
        with connect(f"ws://127.0.0.1:{server.port}/notebooks/{notebook}/{subpath}", additional_headers=headers) as ws:
            deadline = time.monotonic() + 60
            while "persist" not in printed:
                assert time.monotonic() < deadline, printed
                message = json.loads(ws.recv(timeout=30))
                if message[0] == "stdout":
                    printed += message[1]
    finally:
        owner.notebook_request(notebook, "DELETE", f"api/terminals/{name}")
    assert "Kiln notebook: the files under" in printed and "gone when the notebook stops" in printed, printed


@pytest.mark.timeout(900)
def test_a_cell_reads_the_staged_dataset_and_its_file_outlives_a_stop(
    server: KilnServer, people: dict[str, Client], notebook: str
) -> None:
    owner = people["owner"]
    kernel = _kernel(owner, notebook)
    with _channels(owner, server, notebook, kernel) as ws:
        code = (
            "import os, pathlib\n"
            "text = pathlib.Path('data/nbdata/hello.txt').read_text()\n"
            "assert text == pathlib.Path(os.environ['KILN_INPUT_NBDATA'], 'hello.txt').read_text()\n"
            "pathlib.Path(os.environ['HOME'], 'made-in-a-cell.txt').write_text('kept: ' + text)\n"
            "print(text.strip(), '|', os.getcwd())"
        )
        status, printed = _execute(ws, code)
    assert status == "ok", printed
    assert printed.startswith("a staged dataset |"), printed

    stopped = owner.stop_notebook("explore")
    assert stopped.state in ("STOPPING", "STOPPED"), stopped
    stopped = owner.wait_notebook("explore", "STOPPED", timeout=60)
    assert stopped.message.startswith("stopped by"), stopped.message
    with pytest.raises(Conflict) as refused:
        owner.notebook_request(notebook, "GET", "api/status")
    assert "is STOPPED" in refused.value.message, refused.value.message

    owner.start_notebook("explore")
    again = owner.wait_notebook("explore", timeout=240)
    assert again.state == "RUNNING", (again.state, again.message)
    answer = owner.notebook_request(notebook, "GET", "api/contents/made-in-a-cell.txt?content=1")
    assert answer.status_code == 200, answer.text
    assert answer.json()["content"] == "kept: a staged dataset\n"


@pytest.mark.timeout(300)
def test_only_its_user_reaches_it_and_the_console_cookie_needs_this_origin(
    server: KilnServer, people: dict[str, Client], notebook: str
) -> None:
    url = f"{server.url}/notebooks/{notebook}/api/status"
    nobody = httpx.get(url, timeout=30)
    assert nobody.status_code == 401, nobody.text
    forged = httpx.get(url, headers={"Authorization": "token guessed", "Cookie": "kiln_session=forged"}, timeout=30)
    assert forged.status_code == 401, forged.text
    with pytest.raises(NotFound):  # as for a notebook that does not exist
        people["stranger"].notebook_request(notebook, "GET", "api/status")
    with pytest.raises(Forbidden, match="another user's"):
        people["colleague"].notebook_request(notebook, "GET", "api/status")
    assert people["owner"].notebook_request(notebook, "GET", "api/status").status_code == 200

    # The console's way in: a session cookie, with this server as the Origin of anything that changes something.
    owner = people["owner"]
    with httpx.Client(base_url=server.url, timeout=30) as browser:
        signed_in = browser.post("/api/v1/session", json={"key_id": owner.access_key, "secret": owner._secret_key})
        assert signed_in.status_code == 200, signed_in.text
        assert browser.get(url).status_code == 200
        kernels = f"/notebooks/{notebook}/api/kernels"
        cross_site = browser.post(kernels, json={"name": "python3"}, headers={"Origin": "https://evil.example"})
        assert cross_site.status_code == 403 and cross_site.json()["code"] == "csrf", cross_site.text
        assert browser.post(kernels, json={"name": "python3"}).status_code == 403  # no Origin at all
        host = f"127.0.0.1:{server.port}"
        made = browser.post(kernels, json={"name": "python3"}, headers={"Origin": f"http://{host}"})
        assert made.status_code == 201, made.text
        cookie = f"kiln_session={browser.cookies['kiln_session']}"
    channels = f"ws://{host}/notebooks/{notebook}/api/kernels/{made.json()['id']}/channels"
    with pytest.raises(InvalidStatus) as refused:
        connect(channels, additional_headers={"Cookie": cookie}, origin="https://evil.example")  # type: ignore[arg-type]
    assert refused.value.response.status_code == 403
    with connect(channels, additional_headers={"Cookie": cookie}, origin=f"http://{host}") as ws:  # type: ignore[arg-type]
        status, printed = _execute(ws, "print(6 * 7)")
    assert (status, printed.strip()) == ("ok", "42")


@pytest.mark.timeout(120)
def test_jupyterlabs_token_is_on_no_command_line(server: KilnServer, people: dict[str, Client], notebook: str) -> None:
    # Any user of the host reads every process's command line (ps): JupyterLab's token is never on one.
    job_id = people["owner"].get_notebook("explore").job_id
    assert job_id is not None
    state = json.loads((server.home / "jobs" / job_id / "work" / ".kiln-notebook.json").read_text())
    token = state["token"].encode()
    lab = 0
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes() if proc.name.isdigit() else b""
        except OSError:  # gone since it was listed
            continue
        lab += b"jupyterlab" in cmdline
        assert token not in cmdline, cmdline.replace(b"\0", b" ")
    assert lab, "JupyterLab's process was not found: the check above looked at nothing"


@pytest.mark.timeout(300)
def test_another_organisations_job_cannot_connect_to_the_notebook(
    server: KilnServer, people: dict[str, Client], notebook: str
) -> None:
    owner = people["owner"]
    job_id = owner.get_notebook("explore").job_id
    assert job_id is not None
    work = server.home / "jobs" / job_id / "work"
    sock = work / ".kiln-notebook.sock"
    assert sock.is_socket(), sock  # the server's side of it: there, and what the proxy connects to
    # The kernels' ZeroMQ ports (on the loopback of the notebook's own network namespace), from their connection
    # files: an attacker who guessed them tries each on its own loopback and on the address of the host.
    ports = sorted(
        {
            json.loads(f.read_text())[name]
            for f in work.glob(".kiln-jupyter-runtime/kernel-*.json")
            for name in ("shell_port", "iopub_port", "control_port")
        }
    )
    assert ports, "no kernel of the notebook has a connection file"
    targets = [str(sock)] + [(host, port) for port in ports for host in ("127.0.0.1", "10.0.2.2")]
    attack = (
        "import socket, sys, json\n"
        f"for where in {targets!r}:\n"
        "    s = socket.socket(socket.AF_UNIX if isinstance(where, str) else socket.AF_INET)\n"
        "    s.settimeout(3)\n"
        "    try:\n"
        "        s.connect(tuple(where) if isinstance(where, list) else where)\n"
        "        s.sendall(b'GET /api/status HTTP/1.0\\r\\n\\r\\n')\n"
        "        answer = s.recv(64)\n"  # ZeroMQ greets at once; JupyterLab answers the GET
        "        print('REACHED' if answer else 'blocked', where, answer[:8])\n"
        "    except OSError as exc:\n"
        "        print('blocked', where, type(exc).__name__)\n"
    )
    stranger = people["stranger"]
    job = stranger.submit({"command": ["python", "-c", attack], "runtime": {"framework": "python"}})
    done = stranger.wait(job.id, timeout=180)
    assert done.state == "SUCCEEDED", (done.state, done.message)
    log = stranger.read_logs(job.id)[0].decode()
    assert "REACHED" not in log and log.count("blocked") == len(targets), log
    # The control: from the notebook's own namespace the same ports answer (its kernel greets).
    kernel = _kernel(owner, notebook)
    with _channels(owner, server, notebook, kernel) as ws:
        probe = f"import socket; s = socket.create_connection(('127.0.0.1', {ports[0]}), 3); print(len(s.recv(64)) > 0)"
        status, printed = _execute(ws, probe)
    assert (status, printed.strip()) == ("ok", "True"), printed


@pytest.mark.timeout(600)
def test_an_idle_notebook_is_culled_and_a_busy_kernel_is_never_idle(
    server: KilnServer, people: dict[str, Client], notebook: str
) -> None:
    owner = people["owner"]
    created = owner.create_notebook({"name": "idle", "runtime": {"framework": "python"}, "idle_timeout": "8s"})
    ready = owner.wait_notebook("idle", timeout=240)
    assert ready.state == "RUNNING", (ready.state, ready.message)
    kernel = _kernel(owner, created.id)
    with _channels(owner, server, created.id, kernel) as ws:
        started = time.monotonic()
        status, printed = _execute(ws, "import time; time.sleep(20); print('computed')", timeout=120)
        busy_for = time.monotonic() - started
        assert (status, printed.strip()) == ("ok", "computed")
        assert owner.get_notebook("idle").state == "RUNNING", "culled while its kernel was busy"
    assert busy_for >= 20 > 8
    deadline = time.monotonic() + 120
    while (current := owner.get_notebook("idle")).state != "STOPPED":
        assert time.monotonic() < deadline, (current.state, current.message)
        time.sleep(1)
    assert current.message.startswith("culled: idle for 8s"), current.message
    events = owner.events(current.job_id or "")
    assert any("culled: idle" in event.message for event in events), events
    owner.delete_notebook("idle")
    assert all(nb.name != "idle" for nb in owner.list_notebooks())


def _event_file_bytes(tmp: Path, values: list[float]) -> bytes:
    """A TensorBoard event file as ``torch.utils.tensorboard``'s ``add_scalar`` writes one, by tensorboard's own
    writer: scalars ``loss`` at steps 0, 1, 2…"""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(tmp))
    for step, value in enumerate(values):
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag="loss", simple_value=value)])
        writer.add_event(event_pb2.Event(wall_time=1000.0 + step, step=step, summary=summary))
    writer.close()
    (path,) = tmp.glob("events.out.tfevents.*")
    return path.read_bytes()


VALUES = [2.5, 1.25, 0.625]


@pytest.fixture(scope="module")
def tb_job(people: dict[str, Client], tmp_path_factory: pytest.TempPathFactory) -> str:
    """A finished job of the owner's that wrote a TensorBoard event file (``train/``: scalars ``loss``)."""
    owner = people["owner"]
    blob = base64.b64encode(_event_file_bytes(tmp_path_factory.mktemp("tb"), VALUES)).decode()
    write = (
        "import base64, os\n"
        "where = os.path.join(os.environ['KILN_TENSORBOARD_DIR'], 'train')\n"
        "os.makedirs(where, exist_ok=True)\n"
        f"open(os.path.join(where, 'events.out.tfevents.1.worker'), 'wb').write(base64.b64decode('{blob}'))\n"
    )
    job = owner.submit({"name": "mnist-run", "command": ["python", "-c", write], "runtime": {"framework": "python"}})
    assert owner.wait(job.id, timeout=240).state == "SUCCEEDED"
    return job.id


@pytest.mark.timeout(600)
def test_tensorboard_over_a_finished_job_answers_its_scalars_through_the_proxy(
    server: KilnServer, people: dict[str, Client], tb_job: str
) -> None:
    owner, stranger = people["owner"], people["stranger"]
    # Another organisation's user cannot point a TensorBoard at the job.
    with pytest.raises(NotFound, match=tb_job):
        stranger.create_notebook({"name": "tb-stolen", "kind": "tensorboard", "jobs": [tb_job]})
    board = owner.create_notebook({"name": "tb-mnist", "kind": "tensorboard", "jobs": [tb_job], "idle_timeout": "10s"})
    assert board.url.endswith(f"/notebooks/{board.id}/"), board.url
    ready = owner.wait_notebook("tb-mnist", timeout=START_TIMEOUT)
    assert ready.state == "RUNNING", (ready.state, ready.message)
    deadline = time.monotonic() + 60  # TensorBoard loads the log dir in the background (reload interval 5 s)
    while True:
        runs = owner.notebook_request(board.id, "GET", "data/runs")
        assert runs.status_code == 200, runs.text
        if "mnist-run/train" in runs.json():
            break
        assert time.monotonic() < deadline, runs.json()
        time.sleep(1)
    answer = owner.notebook_request(board.id, "GET", "data/plugin/scalars/scalars?run=mnist-run%2Ftrain&tag=loss")
    assert answer.status_code == 200, answer.text
    assert [(step, value) for _, step, value in answer.json()] == list(enumerate(VALUES))
    # Through the proxy only: unsigned, or another organisation's user, is refused.
    assert httpx.get(f"{server.url}/notebooks/{board.id}/data/runs").status_code == 401
    with pytest.raises(NotFound):
        stranger.notebook_request(board.id, "GET", "data/runs")
    # Someone looking (any request: TensorBoard has no kernel) keeps it up past its idle timeout; then it stops.
    looked = time.monotonic()
    while time.monotonic() - looked < 16:
        assert owner.notebook_request(board.id, "GET", "data/environment").status_code == 200
        time.sleep(2)
    assert owner.get_notebook("tb-mnist").state == "RUNNING"
    deadline = time.monotonic() + 60
    while (current := owner.get_notebook("tb-mnist")).state != "STOPPED":
        assert time.monotonic() < deadline, (current.state, current.message)
        time.sleep(1)
    assert current.message.startswith("culled: idle for 10s (nothing reached it through the proxy"), current.message
    owner.delete_notebook("tb-mnist")


@pytest.mark.needs("chromium")
@pytest.mark.timeout(400)
def test_a_jobs_console_page_starts_a_tensorboard_that_opens_in_chromium(
    server: KilnServer, people: dict[str, Client], tb_job: str
) -> None:
    from playwright.sync_api import expect, sync_playwright

    from tests.browser import launch

    owner = people["owner"]
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            context = browser.new_context(viewport={"width": 1280, "height": 800})
            context.set_default_timeout(60_000)
            page = context.new_page()
            page.goto(f"{server.url}/jobs/{tb_job}")
            page.get_by_label("Access key id").fill(owner.access_key or "")
            page.get_by_label("Secret key").fill(owner._secret_key or "")
            page.get_by_role("button", name="Sign in").click()
            page.get_by_test_id("job-tensorboard").click()
            expect(page).to_have_url(f"{server.url}/notebooks")
            row = page.get_by_test_id("notebook-row").filter(has_text=f"tb-{tb_job.removeprefix('job-')}")
            expect(row).to_contain_text("RUNNING", timeout=240_000)  # the first start builds +tensorboard
            with context.expect_page() as opened:
                row.get_by_test_id("open-notebook").click()
            board = opened.value
            expect(board).to_have_title("TensorBoard")
            expect(board.get_by_text("mnist-run/train").first).to_be_visible()
        finally:
            browser.close()
    owner.delete_notebook(f"tb-{tb_job.removeprefix('job-')}")
