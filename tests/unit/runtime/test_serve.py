"""The replica server (``python -m kiln.injob.serve``) as a real process: its ready file, its Unix socket (no TCP
port), the secret, predict, batching across concurrent requests, 422s naming the instance, a failing predictor, a
model that does not load, and a drain on SIGTERM; Kiln's side of the socket (the router's kept-alive connections and
the health probe), with a work dir's path longer than a socket address holds. The predictor is a custom class
written into the replica's work dir (no framework needed); the built-in predictors are checked against real models
in tests/integration/models/test_serve_predictors.py."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from kiln.injob import serve, serve_schema
from kiln.injob.serve_predictors import model_path
from kiln.injob.serve_schema import InputSchema, InvalidInput
from kiln.routing.replica_http import ReplicaPool, ReplicaUnreachable, healthy
from kiln.routing.router import Endpoint, PredictFailed, Router

SRC = str(Path(serve.__file__).resolve().parents[2])

# The service's code bundle: sums each instance and scales it by the number in the model's scale.txt. An instance
# starting with a negative number makes predict raise; one starting with 999 holds predict inside a rendezvous on
# two FIFOs (the test learns predict has started, then lets it finish), for the drain test.
PREDICTOR = """
import os

class Model:
    input_schema = {"shape": [3], "dtype": "float32"}

    def load(self, path):
        with open(os.path.join(path, "scale.txt")) as fh:
            self.scale = float(fh.read())

    def predict(self, batch, parameters):
        if any(row[0] < 0 for row in batch):
            raise RuntimeError("negative input")
        if any(row[0] == 999 for row in batch):
            with open("entered", "w"):
                pass
            with open("gate") as fh:
                fh.read()
        offset = parameters.get("offset", 0)
        return [[sum(row) * self.scale + offset] for row in batch]
"""


class Replica:
    """One ``python -m kiln.injob.serve`` with the custom predictor above, started in ``root/work``."""

    def __init__(
        self,
        root: Path,
        scale: str | None = "2",
        env: dict[str, str] | None = None,
        stage: str | None = None,
        **params: Any,
    ) -> None:
        self.work = root / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        (self.work / "predictor.py").write_text(PREDICTOR)
        if stage:  # the model as the local executor stages an input at an absolute path: inside the work dir
            (self.work / stage).mkdir()
            (self.work / stage / "scale.txt").write_text("3")
        model_dir = root / "model"
        model_dir.mkdir(exist_ok=True)
        if scale is not None:
            (model_dir / "scale.txt").write_text(scale)
        config = {"model_dir": str(model_dir), "predictor": "custom", "class": "predictor:Model", "model": "sum@1"}
        config.update(params)
        params_file = root / "params.json"
        params_file.write_text(json.dumps(config))
        environ = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
        environ.update(KILN_PARAMS_FILE=str(params_file), KILN_WORK_DIR=str(self.work), PYTHONPATH=SRC, **(env or {}))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kiln.injob.serve"],
            cwd=self.work,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.ready_line = self.proc.stdout.readline() if self.proc.stdout else ""  # "" once it has exited
        self.state_file = self.work / serve.STATE_FILE
        self.state: dict[str, Any] = json.loads(self.state_file.read_text()) if self.ready_line else {}
        # The work dir by a short name: its path may be longer than a socket address holds (108 bytes).
        self.dir_fd = os.open(self.work, os.O_PATH | os.O_DIRECTORY)

    @property
    def socket_path(self) -> Path:
        """The socket as Kiln's server names it: ``<jobs dir>/<job id>/work/<name>``."""
        return self.work / self.state["socket"]

    def transport(self) -> httpx.HTTPTransport | None:
        if "socket" not in self.state:
            return None
        return httpx.HTTPTransport(uds=f"/proc/self/fd/{self.dir_fd}/{self.state['socket']}")

    def client(self, secret: str | None = None) -> httpx.Client:
        """A client with the secret (or ``secret``; "": no Authorization header), over the socket or the port."""
        token = self.state["secret"] if secret is None else secret
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = "http://replica" if "socket" in self.state else f"http://127.0.0.1:{self.state['port']}"
        return httpx.Client(base_url=url, transport=self.transport(), headers=headers, timeout=60)

    def predict(self, inputs: Any, **body: Any) -> httpx.Response:
        with self.client() as client:
            return client.post("/predict", json={"inputs": inputs, **body})

    def stop(self) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        _, err = self.proc.communicate(timeout=30)
        return self.proc.returncode, err


@pytest.fixture
def make_replica(tmp_path: Path):  # type: ignore[no-untyped-def]
    replicas: list[Replica] = []

    def factory(
        scale: str | None = "2",
        env: dict[str, str] | None = None,
        stage: str | None = None,
        where: str | None = None,  # its root under tmp_path (a replica started again in the same work dir)
        **params: Any,
    ) -> Replica:
        replica = Replica(tmp_path / (where or f"r{len(replicas)}"), scale, env, stage, **params)
        replicas.append(replica)
        return replica

    yield factory
    for replica in replicas:
        if replica.proc.poll() is None:
            replica.proc.kill()
            replica.proc.communicate(timeout=30)
        os.close(replica.dir_fd)


def test_the_ready_file_appears_after_the_model_loaded_and_only_its_user_can_read_it(make_replica) -> None:
    replica = make_replica()
    assert replica.ready_line == f"serving sum@1 on socket {serve.SOCKET_FILE}\n"
    assert stat.S_IMODE(replica.state_file.stat().st_mode) == 0o600
    assert sorted(replica.state) == ["pid", "secret", "socket"]  # no port: the local way is the socket
    assert replica.state["socket"] == serve.SOCKET_FILE
    assert replica.state["pid"] == replica.proc.pid
    assert len(replica.state["secret"]) >= 32
    dotted = sorted(p.name for p in replica.work.iterdir() if p.name.startswith("."))
    assert dotted == sorted([serve.STATE_FILE, serve.SOCKET_FILE])  # no tmp left
    mode = replica.socket_path.lstat().st_mode
    assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    with replica.client() as client:
        health = client.get("/healthz")
    assert health.status_code == 200 and health.json() == {"ready": True}
    assert replica.stop() == (0, "")
    assert not replica.state_file.exists() and not replica.socket_path.exists()


def test_a_replica_started_the_local_way_opens_no_tcp_or_udp_port(make_replica) -> None:
    replica = make_replica()
    process = psutil.Process(replica.proc.pid)
    assert process.net_connections(kind="inet") == []
    listening = [c.laddr for c in process.net_connections(kind="unix")]
    assert serve.SOCKET_FILE in listening, listening  # bound by its name relative to the work dir
    assert replica.predict([[1, 2, 3]]).json() == {"outputs": [[12.0]]}


def test_the_socket_name_comes_from_the_environment_and_a_stale_socket_is_replaced(make_replica, tmp_path) -> None:
    work = tmp_path / "again" / "work"
    work.mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as stale:  # a killed replica's, left behind: nothing listens on it
        stale.bind(str(work / "replica.sock"))
    replica = make_replica(env={"KILN_REPLICA_SOCKET": "replica.sock"}, where="again")
    assert replica.state["socket"] == "replica.sock"
    assert replica.predict([[1, 0, 0]]).json() == {"outputs": [[2.0]]}
    for env, said in [
        ({"KILN_REPLICA_SOCKET": "../elsewhere.sock"}, "KILN_REPLICA_SOCKET: a file name in the work dir"),
        ({"KILN_REPLICA_SOCKET": "x" * 101}, "KILN_REPLICA_SOCKET: a file name in the work dir"),
        ({"KILN_REPLICA_SOCKET": "r.sock", "KILN_REPLICA_PORT": "0"}, "set one or the other"),
    ]:
        bad = make_replica(env=env)
        code, err = bad.stop()
        assert (code, err.startswith("kiln serve: ")) == (serve.EXIT_CONFIG, True) and said in err, err


def test_every_request_needs_the_secret(make_replica) -> None:
    replica = make_replica()
    with replica.client("") as bare:
        assert bare.get("/healthz").status_code == 401
        refused = bare.post("/predict", json={"inputs": [[1, 2, 3]]})
    assert refused.status_code == 401 and refused.json()["code"] == "unauthorized"
    wrong = replica.state["secret"][:-1] + ("a" if replica.state["secret"][-1] != "a" else "b")
    with replica.client(wrong) as client:
        assert client.post("/predict", json={"inputs": [[1, 2, 3]]}).status_code == 401
    with replica.client() as client:
        assert client.get("/nowhere").status_code == 404
        assert client.get("/predict").status_code == 405


def test_a_pod_gives_the_replica_its_port_and_secret(make_replica) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    replica = make_replica(env={"KILN_REPLICA_PORT": str(port), "KILN_REPLICA_SECRET": "the-pod-secret"})
    assert (replica.state["port"], replica.state["secret"]) == (port, "the-pod-secret")
    assert "socket" not in replica.state and not (replica.work / serve.SOCKET_FILE).exists()
    assert replica.ready_line == f"serving sum@1 on port {port}\n"
    with replica.client("the-pod-secret") as client:
        assert client.post("/predict", json={"inputs": [[1, 0, 0]]}).json() == {"outputs": [[2.0]]}
    bad = make_replica(env={"KILN_REPLICA_PORT": "http"})
    assert bad.stop() == (
        serve.EXIT_CONFIG,
        "kiln serve: KILN_REPLICA_PORT: a port number from 0 to 65535, got 'http'\n",
    )


def test_an_absolute_model_dir_is_found_under_the_work_dir_where_the_local_executor_stages_it(make_replica) -> None:
    staged = f"kiln-test-staged-model-{os.getpid()}"
    assert not Path("/", staged).exists()
    missing = make_replica(scale=None, model_dir=f"/{staged}")
    assert missing.ready_line == ""  # nothing at /<staged> nor under the work dir: the load error names the path
    assert f"from /{staged}: FileNotFoundError" in missing.stop()[1]
    replica = make_replica(scale=None, model_dir=f"/{staged}", stage=staged)
    assert replica.predict([[1, 2, 3]]).json() == {"outputs": [[18.0]]}


def test_predict_answers_one_output_per_instance(make_replica) -> None:
    replica = make_replica()
    answer = replica.predict([[1, 2, 3], [0.5, 0, 0]], parameters={"offset": 1})
    assert answer.status_code == 200, answer.text
    assert answer.json() == {"outputs": [[13.0], [2.0]]}
    assert answer.headers["X-Kiln-Batch-Size"] == "2"
    with replica.client() as client:  # one keep-alive connection, several requests
        for i in range(3):
            again = client.post("/predict", json={"inputs": [[i, 0, 0]]})
            assert again.json() == {"outputs": [[2.0 * i]]}


def test_concurrent_requests_are_batched_and_each_gets_its_own_outputs(make_replica) -> None:
    # A batch closes when it is full (8 instances) or 10 s after its first request: the 4 requests of 2 below,
    # sent together, fill one.
    replica = make_replica(max_batch_size=8, max_latency_ms=10_000)

    def call(i: int) -> httpx.Response:
        return replica.predict([[i, 0, 0], [i, 1, 0]])

    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(call, range(4)))
    for i, answer in enumerate(answers):
        assert answer.status_code == 200, answer.text
        assert answer.json() == {"outputs": [[2.0 * i], [2.0 * i + 2]]}
        assert answer.headers["X-Kiln-Batch-Size"] == "8"
    big = replica.predict([[i, 0, 0] for i in range(20)])  # over max_batch_size: its own batches of 8
    assert big.json() == {"outputs": [[2.0 * i] for i in range(20)]}
    assert big.headers["X-Kiln-Batch-Size"] == "8"


def test_requests_with_other_parameters_are_not_batched_together(make_replica) -> None:
    # A batch of 2 fills with two requests of the same offset, however the four requests arrive.
    replica = make_replica(max_batch_size=2, max_latency_ms=10_000)
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: replica.predict([[1, 0, 0]], parameters={"offset": i % 2}), range(4)))
    assert [a.json()["outputs"] for a in answers] == [[[2.0]], [[3.0]], [[2.0]], [[3.0]]]
    assert {a.headers["X-Kiln-Batch-Size"] for a in answers} == {"2"}


def test_a_wrong_instance_is_a_422_naming_it(make_replica) -> None:
    replica = make_replica()
    short = replica.predict([[1, 2, 3], [1, 2]])
    assert short.status_code == 422
    assert short.json() == {
        "code": "invalid_input",
        "message": "inputs[1]: expected 3 numbers, got 2",
        "details": {"field": "inputs[1]"},
    }
    text = replica.predict([[1, 2, 3], [1, 2, 3], [1, "x", 3]]).json()
    assert text["details"] == {"field": "inputs[2][1]"}
    assert text["message"].startswith("inputs[2][1]: expected a number")
    with replica.client() as client:
        not_json = client.post("/predict", content=b"{nope", headers={"Content-Type": "application/json"})
        no_inputs = client.post("/predict", json={"instances": [[1, 2, 3]]})
    for answer in (not_json, no_inputs):
        assert answer.status_code == 422 and answer.json()["details"] == {"field": "inputs"}


def test_a_predictor_that_raises_is_a_500_with_its_error(make_replica) -> None:
    replica = make_replica()
    failed = replica.predict([[-1, 0, 0]])
    assert failed.status_code == 500
    assert failed.json() == {"code": "predict_error", "message": "RuntimeError: negative input"}
    assert replica.predict([[1, 0, 0]]).json() == {"outputs": [[2.0]]}  # still serving
    code, err = replica.stop()
    assert code == 0 and "RuntimeError: negative input" in err


def test_a_model_that_does_not_load_exits_3_with_the_loaders_error(make_replica) -> None:
    replica = make_replica(scale=None)  # no scale.txt in the model dir
    assert replica.ready_line == ""
    code, err = replica.stop()
    assert code == serve.EXIT_LOAD
    last = err.strip().splitlines()[-1]
    assert last.startswith("kiln serve: cannot load model sum@1 (custom) from ")
    assert "FileNotFoundError" in last and "scale.txt" in last
    assert not replica.state_file.exists()


def test_a_bad_config_exits_2_naming_the_key(make_replica) -> None:
    replica = make_replica(max_batch_size=0)
    code, err = replica.stop()
    assert code == serve.EXIT_CONFIG
    assert "max_batch_size: a whole number from 1 to 4096, got 0" in err


def test_sigterm_stops_accepting_answers_the_request_in_flight_and_exits_0(make_replica) -> None:
    replica = make_replica()
    os.mkfifo(replica.work / "entered")
    os.mkfifo(replica.work / "gate")
    answers: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: answers.append(replica.predict([[999, 0, 0]])))
    worker.start()
    with open(replica.work / "entered"):  # returns once predict has opened it: the request is in flight
        pass
    replica.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 30
    while _accepts(replica):  # the listening socket closes first...
        assert time.monotonic() < deadline, "the replica still accepts connections 30 s after SIGTERM"
        time.sleep(0.05)
    with open(replica.work / "gate", "w") as gate:  # ...then predict may finish
        gate.write("go")
    worker.join(60)
    assert [a.status_code for a in answers] == [200]
    assert answers[0].json() == {"outputs": [[1998.0]]}
    assert answers[0].headers["Connection"] == "close"
    assert replica.proc.wait(30) == 0


def _accepts(replica: Replica) -> bool:
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(5)
            sock.connect(f"/proc/self/fd/{replica.dir_fd}/{replica.state['socket']}")
            return True
    except OSError:
        return False


# -- Kiln's side of the socket: the router and the health probe --------------------------------------------------


def _body(*inputs: list[float]) -> bytes:
    return json.dumps({"inputs": list(inputs)}).encode()


def test_the_router_predicts_through_the_socket_of_a_work_dir_longer_than_a_socket_address(make_replica) -> None:
    replica = make_replica(where="j" * 70 + "/" + "w" * 70)  # <jobs dir>/<job id>/work/.kiln-replica.sock: long
    path = str(replica.socket_path)
    assert len(path.encode()) > 108
    with socket.socket(socket.AF_UNIX) as plain, pytest.raises(OSError):
        plain.connect(path)  # the path itself does not fit a socket address
    assert healthy(path, replica.state["secret"])
    assert not healthy(path, "not-the-secret") and not healthy(path + "-gone", replica.state["secret"])
    router = Router()
    router.add("svc", Endpoint("rep-1", "job-1", path, replica.state["secret"], "sum@1"))

    async def predict() -> list[Any]:
        return [await router.predict("svc", _body([i, 0, 0]), 30) for i in range(3)]

    answers = asyncio.run(predict())
    assert [(a.status, json.loads(a.body), a.replica_id, a.batch_size) for a in answers] == [
        (200, {"outputs": [[2.0 * i]]}, "rep-1", 1) for i in range(3)
    ]
    assert len(router._local._idle[path]) == 1  # one kept-alive connection served the three
    assert router.take_stats("svc")["rep-1"][:2] == (3, 0)


def test_a_kept_alive_connection_the_replica_closed_is_replaced_silently(make_replica) -> None:
    env = {"KILN_REPLICA_SECRET": "s" * 32}
    headers = {"Authorization": f"Bearer {'s' * 32}", "Content-Type": "application/json"}
    pool = ReplicaPool()

    async def run() -> None:
        first = make_replica(env=env, where="r")
        path = str(first.socket_path)
        status, _, body = await pool.post(path, "/predict", headers, _body([1, 0, 0]), 30)
        assert (status, json.loads(body)) == (200, {"outputs": [[2.0]]})
        assert first.stop()[0] == 0  # its connections close with it; another replica takes the same socket
        second = make_replica(env=env, where="r")
        assert second.socket_path == first.socket_path and len(pool._idle[path]) == 1
        status, _, body = await pool.post(path, "/predict", headers, _body([2, 0, 0]), 30)
        assert (status, json.loads(body)) == (200, {"outputs": [[4.0]]})
        assert second.stop()[0] == 0
        with pytest.raises(ReplicaUnreachable, match="FileNotFoundError"):  # no replica at all: not silent
            await pool.post(path, "/predict", headers, _body([3, 0, 0]), 30)

    asyncio.run(run())


def test_a_replica_that_fails_sends_the_request_to_another_and_a_link_is_no_socket(make_replica, tmp_path) -> None:
    replica = make_replica()
    secret = replica.state["secret"]
    link = tmp_path / "link.sock"  # what a job could put in its work dir: a link to another socket of the machine
    link.symlink_to(replica.socket_path)
    assert not healthy(str(link), secret)
    router = Router()
    router.add("svc", Endpoint("linked", "job-1", str(link), secret, "sum@1"))
    router.add("svc", Endpoint("real", "job-2", str(replica.socket_path), secret, "sum@1"))

    async def run() -> None:
        answer = await router.predict("svc", _body([1, 1, 1]), 30)  # "linked" is picked first, and refused
        assert (answer.status, answer.replica_id, json.loads(answer.body)) == (200, "real", {"outputs": [[6.0]]})
        stats = router.take_stats("svc")
        assert (stats["linked"][:2], stats["real"][:2]) == ((1, 1), (1, 0))
        assert replica.stop()[0] == 0  # its kept-alive connection closes: an error now, not a silent retry
        router.add("svc", Endpoint("other", "job-3", str(replica.socket_path) + "-gone", secret, "sum@1"))
        with pytest.raises(PredictFailed, match="replicas failed to answer"):
            await router.predict("svc", _body([1, 1, 1]), 3)

    asyncio.run(run())
    with pytest.raises(ValueError, match="one of the two"):
        Endpoint("both", "job-4", str(link), secret, "sum@1", base_url="http://elsewhere")


# -- the pieces, in process ---------------------------------------------------------------------------------


def test_the_config_is_read_from_flat_params_with_the_schema_json_encoded() -> None:
    config = serve.ServeConfig.from_params(
        {
            "predictor": "sklearn",
            "class": "",
            "file": "model.joblib",
            "method": "predict_proba",
            "input_schema": json.dumps({"shape": [64], "dtype": "float64"}),
            "max_batch_size": 16,
            "max_latency_ms": 2.5,
            "model": "digits@3",
        }
    )
    assert config.model_dir == "/model" and config.class_path is None and config.file == "model.joblib"
    assert config.input_schema == InputSchema((64,), "float64")
    assert (config.max_batch_size, config.max_latency_ms, config.method) == (16, 2.5, "predict_proba")


@pytest.mark.parametrize(
    ("params", "said"),
    [
        ({"predictor": "tensorflow"}, "predictor: one of"),
        ({"predictor": "custom", "class": "predictor"}, "class: a custom predictor needs module:Class"),
        ({"predictor": "sklearn", "method": "transform"}, "method: predict or predict_proba"),
        ({"predictor": "onnx", "input_schema": "{shape"}, "input_schema: not JSON"),
        ({"predictor": "onnx", "input_schema": '{"shape": [0]}'}, "input_schema.shape[0]: a dimension is"),
        ({"predictor": "onnx", "input_schema": '{"dtype": "int8"}'}, "input_schema.dtype: one of"),
        ({"predictor": "onnx", "max_latency_ms": -1}, "max_latency_ms: a number from 0"),
        ({"predictor": "onnx", "max_batch_size": True}, "max_batch_size: a whole number"),
    ],
)
def test_a_bad_param_is_named(params: dict[str, Any], said: str) -> None:
    with pytest.raises(ValueError, match="^" + re.escape(said)):
        serve.ServeConfig.from_params(params)


@pytest.mark.parametrize(
    ("schema", "inputs", "field", "message"),
    [
        (InputSchema((2, 2)), [[[1, 2], [3, 4]], [[1, 2]]], "inputs[1]", "expected 2 lists, got 1"),
        (InputSchema((2, 2)), [[[1, 2], [3]]], "inputs[0][1]", "expected 2 numbers, got 1"),
        (InputSchema((None,)), [[1, 2, 3], 4], "inputs[1]", "expected a list of numbers, got 4"),
        (InputSchema((2,), "int64"), [[1, 2.5]], "inputs[0][1]", "expected a whole number (int64), got 2.5"),
        (InputSchema((1,)), [[True]], "inputs[0][0]", "expected a number, got true"),
        (InputSchema((), "string"), ["a", 3], "inputs[1]", "expected a string, got 3"),
        (InputSchema((1,)), [[float("nan")]], "inputs[0][0]", "expected a finite number, got nan"),
    ],
)
def test_the_schema_names_the_first_wrong_value(schema: InputSchema, inputs: list[Any], field: str, message: str):
    with pytest.raises(InvalidInput) as raised:
        schema.check(inputs)
    assert raised.value.field == field
    assert str(raised.value) == f"{field}: {message}"


def test_the_schema_takes_what_fits() -> None:
    InputSchema((None, 2)).check([[[1, 2]], [[1, 2], [3.5, 4]]])
    InputSchema((), "string").check(["a", "b"])
    InputSchema((2,), "int64").check([[1, -(2**63)]])


def test_the_model_file_is_the_named_one_or_the_only_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="holds no file"):
        model_path(str(tmp_path), None)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "model.pt").write_bytes(b"x")
    assert model_path(str(tmp_path), None) == tmp_path / "sub" / "model.pt"
    (tmp_path / "labels.txt").write_text("a")
    with pytest.raises(ValueError, match=r"holds 2 files .*say which one in predictor\.file"):
        model_path(str(tmp_path), None)
    assert model_path(str(tmp_path), "labels.txt") == (tmp_path / "labels.txt").resolve()
    with pytest.raises(FileNotFoundError, match=r"no file 'other\.pt'"):
        model_path(str(tmp_path), "other.pt")
    with pytest.raises(ValueError, match="outside the model directory"):
        model_path(str(tmp_path), "../x")


def test_the_replica_reads_what_the_domain_writes() -> None:
    """kiln.injob cannot import kiln.domain: its copy of the spec's bounds and the schema must agree with it."""
    from typing import get_args

    from kiln.domain.serving import Batching, PredictorType, ServiceSpec, replica_params
    from kiln.domain.serving import InputSchema as DomainSchema

    assert set(serve.PREDICTORS) == set(get_args(PredictorType))
    dtypes = get_args(DomainSchema.model_fields["dtype"].annotation)
    assert set(dtypes) == set(serve_schema.DTYPES)
    domain = DomainSchema(shape=[None, 28], dtype="float64")
    assert InputSchema.parse(json.loads(domain.model_dump_json())) == InputSchema((None, 28), "float64")
    size = Batching.model_fields["max_batch_size"].metadata
    latency = Batching.model_fields["max_latency_ms"].metadata
    assert [m.le for m in size if hasattr(m, "le")] == [serve.MAX_BATCH_SIZE]
    assert [m.le for m in latency if hasattr(m, "le")] == [serve.MAX_LATENCY_MS]
    spec = ServiceSpec.model_validate(
        {
            "name": "digits",
            "model": "digits@production",
            "predictor": {"type": "custom", "class": "predictor:Model", "input_schema": {"shape": [64]}},
            "batching": {"max_batch_size": 16, "max_latency_ms": 2},
        }
    )
    params = json.loads(json.dumps(replica_params(spec, ("digits", 3))))  # as $KILN_PARAMS_FILE holds them
    assert serve.ServeConfig.from_params(params) == serve.ServeConfig(
        predictor="custom",
        class_path="predictor:Model",
        input_schema=InputSchema((64,), "float32"),
        max_batch_size=16,
        max_latency_ms=2.0,
        model="digits@3",
    )
    plain = ServiceSpec.model_validate({"name": "d", "model": "d@1", "predictor": {"type": "sklearn"}})
    assert serve.ServeConfig.from_params(replica_params(plain, ("d", 1))) == serve.ServeConfig(
        predictor="sklearn", model="d@1"
    )
