"""``python -m kiln.injob.serve``: the process every replica of a model service runs (a job of category
``serve``). Standard library only: it runs in the job's runtime, whose frameworks the predictor imports when it
loads (``kiln.injob.serve_predictors``).

Its config is the job's params, read from the JSON file ``$KILN_PARAMS_FILE`` (flat keys, scalar values)::

    {"model_dir": "/model", "predictor": "sklearn", "class": null, "file": null, "method": "predict",
     "input_schema": "{\\"shape\\": [64], \\"dtype\\": \\"float32\\"}", "max_batch_size": 1, "max_latency_ms": 0,
     "model": "digits@3"}

It loads the model, listens on a Unix socket in the current directory (the job's work dir on the local executor),
named ``$KILN_REPLICA_SOCKET`` or ``.kiln-replica.sock``, mode 0600, and only then writes ``{"socket", "secret",
"pid"}`` to ``$KILN_WORK_DIR/.kiln-replica.json`` (atomically, mode 0600), which is how Kiln's router finds it: it
connects to the socket's file in the job's work dir, from outside the job's network namespace, and no other job can
reach it (no TCP port is open). The socket is bound by its relative name, so a work dir's path of any length fits.
Every request must carry ``Authorization: Bearer <secret>``. A Kubernetes pod, which a Service reaches on a fixed
port with a secret from a Secret, sets ``KILN_REPLICA_HOST``, ``KILN_REPLICA_PORT`` and ``KILN_REPLICA_SECRET``
instead (kiln.backends.kubernetes.serving): then it listens on TCP and the state file holds ``"port"``.

- ``GET /healthz`` → 200 ``{"ready": true}`` (503 ``{"ready": false}`` once draining);
- ``POST /predict`` ``{"inputs": [...], "parameters": {...}}`` → 200 ``{"outputs": [...]}`` with the header
  ``X-Kiln-Batch-Size``; 422 ``{"code": "invalid_input", "message": "inputs[3]: ...", "details": {"field":
  "inputs[3]"}}``; 500 ``{"code": "predict_error", "message": ...}``.

A model that does not load: its loader's error as the last line on stderr and exit 3 (a bad config: exit 2).
SIGTERM or SIGINT: stop accepting connections, finish the requests in flight, exit 0.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import secrets
import signal
import socket
import socketserver
import stat
import sys
import threading
import traceback
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

from kiln.injob import statefile
from kiln.injob.serve_batch import Batcher
from kiln.injob.serve_mlflow import MlflowPredictor
from kiln.injob.serve_predictors import Predictor, load_predictor
from kiln.injob.serve_schema import InputSchema, InstanceCheck, InvalidInput

STATE_FILE = ".kiln-replica.json"
SOCKET_FILE = ".kiln-replica.sock"
MAX_SOCKET_NAME = 100  # bytes: a relative name for bind() must fit sun_path (108 with its NUL)
EXIT_CONFIG = 2
EXIT_LOAD = 3
PREDICTORS = ("torchscript", "torch-export", "onnx", "sklearn", "mlflow", "custom")
CLASS_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
MAX_BATCH_SIZE = 4096
MAX_LATENCY_MS = 10_000.0
MAX_BODY = 256 * 1024 * 1024
LOG_EVERY = 1000  # requests per progress line: the replica's log stays quiet (the router records request metrics)


@dataclass(frozen=True)
class ServeConfig:
    """The replica's params (see the module docstring)."""

    predictor: str
    model_dir: str = "/model"
    class_path: str | None = None
    file: str | None = None
    method: str = "predict"
    input_schema: InputSchema | None = None
    max_batch_size: int = 1
    max_latency_ms: float = 0.0
    model: str = "model"

    @classmethod
    def from_params(cls, params: Any) -> ServeConfig:
        """ValueError naming the key."""
        if not isinstance(params, dict):
            raise ValueError(f"expected a JSON object, got {type(params).__name__}")

        def text(key: str, default: str | None) -> str | None:
            value = params.get(key)
            if value is None or value == "":
                return default
            if not isinstance(value, str):
                raise ValueError(f"{key}: expected a string, got {value!r}")
            return value

        predictor = text("predictor", None)
        if predictor not in PREDICTORS:
            raise ValueError(f"predictor: one of {', '.join(PREDICTORS)}, got {params.get('predictor')!r}")
        class_path = text("class", None)
        if predictor == "custom" and (class_path is None or not CLASS_PATH.fullmatch(class_path)):
            raise ValueError(f"class: a custom predictor needs module:Class (e.g. predictor:Model), got {class_path!r}")
        method = text("method", "predict")
        if method not in ("predict", "predict_proba"):
            raise ValueError(f"method: predict or predict_proba, got {method!r}")
        schema = params.get("input_schema")
        if isinstance(schema, str) and schema:
            try:
                schema = json.loads(schema)
            except ValueError as exc:
                raise ValueError(f"input_schema: not JSON ({exc})") from None
        size = params.get("max_batch_size", 1)
        if isinstance(size, float) and size.is_integer():
            size = int(size)
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH_SIZE:
            raise ValueError(f"max_batch_size: a whole number from 1 to {MAX_BATCH_SIZE}, got {size!r}")
        latency = params.get("max_latency_ms", 0)
        if isinstance(latency, bool) or not isinstance(latency, int | float) or not 0 <= latency <= MAX_LATENCY_MS:
            raise ValueError(f"max_latency_ms: a number from 0 to {MAX_LATENCY_MS:g}, got {latency!r}")
        return cls(
            predictor=predictor,
            model_dir=text("model_dir", "/model") or "/model",
            class_path=class_path,
            file=text("file", None),
            method=method or "predict",
            input_schema=InputSchema.parse(schema) if schema else None,
            max_batch_size=size,
            max_latency_ms=float(latency),
            model=text("model", "model") or "model",
        )


def read_config(environ: Mapping[str, str]) -> ServeConfig:
    """The config from ``$KILN_PARAMS_FILE``; ValueError saying which file and key."""
    path = environ.get("KILN_PARAMS_FILE")
    if not path:
        raise ValueError("KILN_PARAMS_FILE is not set: a replica reads its config from the job's params")
    try:
        params = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read the params file {path}: {exc}") from None
    try:
        return ServeConfig.from_params(params)
    except ValueError as exc:
        raise ValueError(f"params ({path}): {exc}") from None


def listen_address(environ: Mapping[str, str]) -> str | tuple[str, int]:
    """Where to listen: TCP ``($KILN_REPLICA_HOST or 127.0.0.1, $KILN_REPLICA_PORT or 0)`` where either is set (a
    Kubernetes pod), else the name of a Unix socket in the current directory: ``$KILN_REPLICA_SOCKET`` or
    :data:`SOCKET_FILE` (the local executor)."""
    name = environ.get("KILN_REPLICA_SOCKET")
    host = environ.get("KILN_REPLICA_HOST")
    port = environ.get("KILN_REPLICA_PORT")
    if host or port:
        if name:
            raise ValueError(
                "KILN_REPLICA_SOCKET is set with KILN_REPLICA_HOST or KILN_REPLICA_PORT: set one or the other"
            )
        port = port or "0"
        if not port.isdigit() or int(port) > 65535:
            raise ValueError(f"KILN_REPLICA_PORT: a port number from 0 to 65535, got {port!r}")
        return host or "127.0.0.1", int(port)
    name = name or SOCKET_FILE
    if "/" in name or name in (".", "..") or len(name.encode("utf-8", "surrogateescape")) > MAX_SOCKET_NAME:
        raise ValueError(
            f"KILN_REPLICA_SOCKET: a file name in the work dir (no '/', at most {MAX_SOCKET_NAME} bytes), got {name!r}"
        )
    return name


def write_state(directory: Path, state: dict[str, Any]) -> Path:
    """``state`` as the state file in ``directory`` (kiln.injob.statefile: mode 0600, whole or not at all)."""
    return statefile.write_state(directory / STATE_FILE, state)


class ReplicaServer(ThreadingHTTPServer):
    """The replica's HTTP server: the loaded predictor, the secret, and the count of requests in flight (what a
    drain waits for). Idle keep-alive connections hold daemon threads, which do not keep the process up."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = 256  # a burst of new connections from the router must not be dropped (SYN retries: 1 s)

    def __init__(
        self,
        address: str | tuple[str, int],
        secret: str,
        predictor: Predictor,
        schema: InstanceCheck | None,
        batcher: Batcher,
        model: str,
    ) -> None:
        self.predictor = predictor
        self.schema = schema
        self.batcher = batcher
        self.model = model
        self.secret = secret
        self.expected = f"Bearer {self.secret}".encode()
        self.cond = threading.Condition()
        self.in_flight = 0
        self.draining = False
        self.answered = 0
        self.failed = 0
        self.error_logged = False
        super().__init__(cast(Any, address), self.handler())

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return ReplicaHandler

    def server_bind(self) -> None:
        # HTTPServer.server_bind looks the host's name up (getfqdn): a DNS query a sandbox may wait on.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), int(self.server_address[1])

    @property
    def port(self) -> int:
        return int(self.server_address[1])

    def where(self) -> str:
        return f"port {self.port}"

    def state(self) -> dict[str, Any]:
        """Where Kiln finds this replica (the state file's ``port`` or ``socket``)."""
        return {"port": self.port}

    def begin(self) -> None:
        with self.cond:
            self.in_flight += 1

    def end(self, failed: bool) -> None:
        with self.cond:
            self.in_flight -= 1
            self.answered += 1
            self.failed += failed
            self.cond.notify_all()
            line = self.answered % LOG_EVERY == 0
            answered, errors = self.answered, self.failed
        if line:
            print(f"answered {answered} requests ({errors} failed) for {self.model}", flush=True)

    def drain(self) -> None:
        """Wait for the requests in flight; responses from now on close their connections."""
        with self.cond:
            self.draining = True
            while self.in_flight:
                self.cond.wait()

    def log_predict_error(self, exc: BaseException) -> None:
        """The first failed predict's traceback on stderr; later ones are counted in the progress lines."""
        if not self.error_logged:
            self.error_logged = True
            traceback.print_exception(exc, file=sys.stderr)
            print(f"kiln serve: predict failed (further failures are counted, not shown): {exc}", file=sys.stderr)


class UnixReplicaServer(ReplicaServer):
    """The replica's server on a Unix socket: ``address`` is its file's name in the current directory (bound by
    that relative name, so the directory's path may be of any length), created mode 0600, removed on close."""

    address_family = socket.AF_UNIX

    def handler(self) -> type[BaseHTTPRequestHandler]:
        return UnixReplicaHandler

    def server_bind(self) -> None:
        name = str(self.server_address)
        try:  # a socket an earlier run in this work dir left (killed): bind() would find the name taken
            if stat.S_ISSOCK(os.lstat(name).st_mode):
                os.unlink(name)
        except FileNotFoundError:
            pass
        mask = os.umask(0o177)  # created 0600 (no moment with a wider mode): only this uid (and root) connects
        try:
            self.socket.bind(name)
        finally:
            os.umask(mask)
        self.bound: os.stat_result | None = os.stat(name)
        self.server_name, self.server_port = name, 0

    @property
    def port(self) -> int:
        return 0

    def where(self) -> str:
        return f"socket {self.server_address}"

    def state(self) -> dict[str, Any]:
        return {"socket": str(self.server_address)}

    def server_close(self) -> None:
        super().server_close()
        bound, self.bound = getattr(self, "bound", None), None
        name = str(self.server_address)
        try:  # ours only: not a socket another replica bound at the same name since
            if bound is not None and os.path.samestat(os.lstat(name), bound):
                os.unlink(name)
        except FileNotFoundError:
            pass


class ReplicaHandler(BaseHTTPRequestHandler):
    server: ReplicaServer
    protocol_version = "HTTP/1.1"  # keep-alive: the router reuses its connections
    disable_nagle_algorithm = True  # the headers and the body are two writes: no delayed-ACK stall between them
    server_version = "kiln-replica"
    sys_version = ""
    timeout = 600  # an idle keep-alive connection is closed after this long

    def log_message(self, format: str, *args: Any) -> None:  # quiet: one line per request would flood the job log
        pass

    def do_GET(self) -> None:
        self._serve("GET")

    def do_POST(self) -> None:
        self._serve("POST")

    def do_PUT(self) -> None:
        self._serve("PUT")

    def do_DELETE(self) -> None:
        self._serve("DELETE")

    def _serve(self, method: str) -> None:
        self.server.begin()
        status = 500
        try:
            status = self._route(method)
        finally:
            self.server.end(failed=status >= 500)

    def _route(self, method: str) -> int:
        given = self.headers.get("Authorization", "").encode("utf-8", "replace")
        if not hmac.compare_digest(given, self.server.expected):
            self.close_connection = True  # its body is not read
            return self._send(401, {"code": "unauthorized", "message": "a replica answers only Kiln's router"})
        path = self.path.split("?", 1)[0]
        if path not in ("/healthz", "/predict"):
            self._discard_body()
            return self._send(404, {"code": "not_found", "message": f"no route {path}"})
        if (path, method) not in (("/healthz", "GET"), ("/predict", "POST")):
            self._discard_body()
            allowed = "GET" if path == "/healthz" else "POST"
            return self._send(405, {"code": "method_not_allowed", "message": f"{path}: {allowed} only"})
        if path == "/healthz":
            ready = not self.server.draining
            return self._send(200 if ready else 503, {"ready": ready})
        return self._predict()

    def _predict(self) -> int:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            return self._send(411, {"code": "length_required", "message": "a predict request needs Content-Length"})
        if int(length) > MAX_BODY:
            self.close_connection = True
            return self._send(413, {"code": "too_large", "message": f"the body is over {MAX_BODY} bytes"})
        body = self.rfile.read(int(length))
        try:
            request = json.loads(body)
        except ValueError as exc:
            return self._invalid("inputs", f"the body is not JSON ({exc})")
        if not isinstance(request, dict) or not isinstance(request.get("inputs"), list):
            return self._invalid("inputs", 'the body must be an object with a list "inputs"')
        inputs: list[Any] = request["inputs"]
        parameters = request.get("parameters") or {}
        if not isinstance(parameters, dict):
            return self._invalid("parameters", "must be an object")
        if not inputs:
            return self._invalid("inputs", "at least one instance")
        if self.server.schema is not None:
            try:
                self.server.schema.check(inputs)
            except InvalidInput as exc:
                return self._invalid(exc.field, str(exc))
        try:
            outputs, batch_size = self.server.batcher.run(inputs, parameters)
            payload = json.dumps({"outputs": outputs}, separators=(",", ":"), allow_nan=False).encode()
        except Exception as exc:
            self.server.log_predict_error(exc)
            message = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ValueError) and "JSON compliant" in str(exc):
                message = f"the outputs are not JSON (NaN or infinity): {exc}"
            return self._send(500, {"code": "predict_error", "message": message})
        return self._send(200, payload, {"X-Kiln-Batch-Size": str(batch_size)})

    def _invalid(self, field: str, message: str) -> int:
        if not message.startswith(f"{field}:"):
            message = f"{field}: {message}"
        return self._send(422, {"code": "invalid_input", "message": message, "details": {"field": field}})

    def _discard_body(self) -> None:
        length = self.headers.get("Content-Length")
        if length and length.isdigit() and int(length) <= MAX_BODY:
            self.rfile.read(int(length))
        elif length:
            self.close_connection = True

    def _send(self, status: int, payload: dict[str, Any] | bytes, headers: dict[str, str] | None = None) -> int:
        body = payload if isinstance(payload, bytes) else json.dumps(payload, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if self.server.draining or self.close_connection:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)
        return status


class UnixReplicaHandler(ReplicaHandler):
    disable_nagle_algorithm = False  # TCP_NODELAY is TCP's: setsockopt fails on a Unix socket


def _exit_now(signum: int, frame: object) -> None:
    raise SystemExit(0)  # stopped while the model loads: nothing is served yet


def main() -> int:
    try:
        config = read_config(os.environ)
        address = listen_address(os.environ)
    except ValueError as exc:
        print(f"kiln serve: {exc}", file=sys.stderr, flush=True)
        return EXIT_CONFIG
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _exit_now)
    dtype = config.input_schema.dtype if config.input_schema is not None else "float32"
    model_dir = config.model_dir
    if not os.path.exists(model_dir):
        # The local executor stages an input at its path inside the work dir (the replica's cwd): /model → ./model.
        local = os.path.join(os.getcwd(), model_dir.lstrip("/"))
        model_dir = local if os.path.exists(local) else model_dir
    try:
        if config.predictor == "mlflow":  # an MLflow model directory (--from-run): its MLmodel says how to load it
            predictor: Predictor = MlflowPredictor(Path(model_dir), config.method)
        else:
            predictor = load_predictor(
                config.predictor, model_dir, config.file, config.class_path, config.method, dtype
            )
    except Exception as exc:
        traceback.print_exc()
        where = config.model_dir + (f"/{config.file}" if config.file else "")
        print(
            f"kiln serve: cannot load model {config.model} ({config.predictor}) from {where}: "
            f"{type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_LOAD
    # From here on SIGTERM and SIGINT are taken by sigwait below, never by a handler in the middle of a request:
    # the threads started after this inherit the blocked mask.
    stop_signals = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals)
    batcher = Batcher(
        predictor.predict, config.max_batch_size, config.max_latency_ms, keyed_by_parameters=predictor.takes_parameters
    )
    secret = os.environ.get("KILN_REPLICA_SECRET") or secrets.token_urlsafe(32)
    schema = config.input_schema or predictor.input_schema
    try:
        if isinstance(address, str):
            server: ReplicaServer = UnixReplicaServer(address, secret, predictor, schema, batcher, config.model)
        else:
            server = ReplicaServer(address, secret, predictor, schema, batcher, config.model)
    except OSError as exc:
        where = f"socket {address}" if isinstance(address, str) else f"{address[0]} port {address[1]}"
        print(f"kiln serve: cannot listen on {where}: {exc}", file=sys.stderr, flush=True)
        return 1
    batcher.start()
    threading.Thread(target=server.serve_forever, name="kiln-serve", daemon=True).start()
    state_dir = Path(os.environ.get("KILN_WORK_DIR") or os.getcwd())
    state = write_state(state_dir, {**server.state(), "secret": server.secret, "pid": os.getpid()})
    print(f"serving {config.model} on {server.where()}", flush=True)
    signal.sigwait(stop_signals)
    server.shutdown()  # no new connections accepted
    server.server_close()
    server.drain()  # the requests in flight are answered
    batcher.stop()
    state.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
