"""``kiln.Client``: the Python SDK over the signed REST API (httpx). The CLI uses nothing else.

Credentials come from the arguments, else ``KILN_ENDPOINT`` / ``KILN_ACCESS_KEY`` / ``KILN_SECRET_KEY``, else
``KILN_JOB_TOKEN`` (set by Kiln inside a running job), else the file ``kiln login`` writes (``KILN_CONFIG``, else
``config`` in ``kiln.sdk.config.client_dir()``: ``$KILN_CLIENT_DIR``, else ``$KILN_HOME``, else ``~/.kiln``); a
refused request says which of them to check (``kiln.sdk.credentials``).
Requests with an access key are signed (KILN-HMAC-SHA256); requests with a job token carry
``Authorization: Bearer <token>`` and no signature. Errors are raised as the same ``kiln.errors`` classes the
server maps, e.g. ``kiln.errors.NotFound``.

Every create (submit, rerun, a study, a service, a model version) is sent with an ``Idempotency-Key``, a new UUID
per call unless the caller gives one (``idempotency_key=``), and is retried with that key, as reads are, after a lost
connection or a 502/503/504 for up to ``retry_seconds`` (60 s; ``KILN_RETRY_SECONDS``): the server answers a
repeat with what the first try created, so a retry never makes a second job (kiln.sdk.retries,
docs/idempotency.md). Other writes are sent once.

The organisation, user, key, quota and audit methods live in ``kiln.sdk.tenancy.TenancyMixin``; the runtime
catalog's in ``kiln.sdk.runtimes.RuntimesMixin``.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from kiln.auth import signing
from kiln.domain.idempotency import HEADER as IDEMPOTENCY_HEADER
from kiln.domain.idempotency import new_key
from kiln.domain.schemas import (
    ArtifactRead,
    EventRead,
    JobRead,
    JobSubmit,
    MetricsCompare,
    MetricsData,
    MetricSeriesData,
    MetricSeriesSummary,
    MetricsIngested,
    MetricsSummary,
    TensorBoardImageList,
    WhoAmI,
    WhyRead,
)
from kiln.domain.spec import JobSpec
from kiln.domain.states import JobState
from kiln.errors import BadRequest, KilnError, NotFound, Unauthenticated, error_from_body
from kiln.sdk import credentials, reached
from kiln.sdk.datasets import DatasetsMixin
from kiln.sdk.download_marks import mark_download
from kiln.sdk.job_actions import JobActionsMixin
from kiln.sdk.logs import LogLine, LogParser
from kiln.sdk.models import ModelsMixin
from kiln.sdk.notebooks import NotebooksMixin
from kiln.sdk.notifications import NotificationsMixin
from kiln.sdk.packaging import DEFAULT_MAX_CODE_BYTES, build_bundle
from kiln.sdk.pipelines import PipelinesMixin
from kiln.sdk.retries import CONNECT_ERRORS, RETRY_ERRORS, RETRY_STATUSES, SAFE_METHODS, RetryPolicy, retry_after
from kiln.sdk.runtimes import RuntimesMixin
from kiln.sdk.services import ServicesMixin
from kiln.sdk.studies import StudiesMixin
from kiln.sdk.tenancy import TenancyMixin
from kiln.sdk.tracking import TrackingMixin
from kiln.sdk.usage import UsageMixin
from kiln.settings import ClientSettings

log = logging.getLogger(__name__)

Progress = Callable[[int], None]


def _check_segments(path: str) -> None:
    """Refuse, before anything is sent, a path with a segment that cannot be the id or name put there: empty, '.'
    or '..' (which the URL resolves: ``kiln jobs show ../whoami`` called GET /api/v1/whoami) or holding '?' or '#'
    (which would begin the query)."""
    for segment in path.split("/")[1:]:
        if segment in ("", ".", "..") or "?" in segment or "#" in segment:
            what = "an empty id or name" if not segment else f"{segment!r} is not an id or a name"
            raise BadRequest(f"{what} (in the request path {path})")


class Client(
    JobActionsMixin,
    TenancyMixin,
    DatasetsMixin,
    ModelsMixin,
    RuntimesMixin,
    StudiesMixin,
    ServicesMixin,
    NotebooksMixin,
    PipelinesMixin,
    TrackingMixin,
    UsageMixin,
    NotificationsMixin,
):
    """A connection to one Kiln server: signed with an access key, or carrying a running job's token."""

    def __init__(
        self,
        endpoint: str | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
        *,
        job_token: str | None = None,
        timeout: float | None = None,
        retry_seconds: float | None = None,
        settings: ClientSettings | None = None,
    ) -> None:
        """``retry_seconds``: how long a request that is safe to repeat is retried (see the module's docstring);
        0 never retries. By default ``KILN_RETRY_SECONDS``, else 60."""
        if job_token and (access_key or secret_key):
            raise ValueError("give either access_key and secret_key, or job_token, not both")
        settings = settings or ClientSettings()
        # Each value with where it came from, so that a refusal can say what to check (kiln.sdk.credentials).
        self._credentials = credentials.resolve(endpoint, access_key, secret_key, job_token, settings)
        self.endpoint = self._credentials.endpoint
        self.access_key = self._credentials.access_key
        self._secret_key = self._credentials.secret_key
        self._job_token = self._credentials.job_token
        self._http = httpx.Client(base_url=self.endpoint, timeout=timeout or settings.timeout)
        self.retries = RetryPolicy(total=settings.retry_seconds if retry_seconds is None else retry_seconds)
        self.first_contact_seconds = settings.first_contact_seconds

    @property
    def uses_job_token(self) -> bool:
        """True when requests carry a job token (``Authorization: Bearer``) instead of a signature."""
        return bool(self._job_token)

    def __repr__(self) -> str:  # never show the secret or the token
        if self._job_token:
            return f"Client(endpoint={self.endpoint!r}, auth='job-token')"
        return f"Client(endpoint={self.endpoint!r}, access_key={self.access_key!r})"

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------------

    def _prepare(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None,
        body: bytes | None,
        unsigned: bool,
        content_sha256: str | None = None,
    ) -> tuple[str, dict[str, str]]:
        pairs: list[tuple[str, str]] = []
        for key, value in (params or {}).items():
            if value is None:
                continue
            values = value if isinstance(value, list | tuple) else [value]
            pairs.extend((key, str(v).lower() if isinstance(v, bool) else str(v)) for v in values)
        query = signing.canonical_query(pairs)
        url_path = "/api/v1" + path
        _check_segments(url_path)
        target = url_path + (f"?{query}" if query else "")
        if self._job_token:  # a bearer token: no signature headers at all
            return target, {"Authorization": f"Bearer {self._job_token}"}
        content_hash = content_sha256 or signing.body_sha256(body or b"")
        headers = signing.sign_headers(
            access_key=self.access_key,
            secret_key=self._secret_key,
            method=method,
            path=httpx.URL(self.endpoint + url_path).raw_path.decode(),
            query=query,
            content_sha256=signing.UNSIGNED_PAYLOAD if unsigned else content_hash,
        )
        # Send the query exactly as signed (already RFC 3986 encoded and sorted).
        return target, headers

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        json_body: Any = None,
        content: Any = None,
        unsigned: bool = False,
        content_sha256: str | None = None,
        extra_headers: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        retry: bool | None = None,
    ) -> httpx.Response:
        """One API call (``path`` below /api/v1). A ``bytes`` ``content`` is signed with its hash; a streamed one
        needs ``content_sha256`` (or ``unsigned`` where the route allows it). ``idempotency_key``: a create's
        Idempotency-Key. A GET or HEAD, or a request with a key, is retried (``self.retries``) unless ``retry`` is
        False; ``retry=True`` retries another request that changes nothing (a dry run). A streamed body is never
        retried: it cannot be sent twice."""
        body = json.dumps(json_body).encode() if json_body is not None else None
        if body is None and isinstance(content, bytes):
            body, content = content, None
        headers = dict(extra_headers or {})
        if json_body is not None:
            headers["Content-Type"] = "application/json"
        if idempotency_key is not None:
            headers[IDEMPOTENCY_HEADER] = idempotency_key
        if retry is None:
            retry = method in SAFE_METHODS or idempotency_key is not None
        retry = retry and content is None
        clock = self.retries.start()
        began = time.monotonic()
        while True:
            try:
                response = self._send(method, path, params, body, content, unsigned, content_sha256, headers)
            except httpx.TransportError as exc:
                if isinstance(exc, CONNECT_ERRORS) and clock.tries == 0 and self._never_answered():
                    clock.shorten(self.first_contact_seconds, began)
                if retry and isinstance(exc, RETRY_ERRORS) and clock.tries == 0 and self.retries.total > 0:
                    # Said once per call: a wrong endpoint otherwise looks like a hang for the whole window.
                    window = round(clock.deadline - began, 1)
                    setting = "KILN_RETRY_SECONDS" if window >= self.retries.total else "KILN_FIRST_CONTACT_SECONDS"
                    log.warning(
                        "cannot reach Kiln at %s (%s); trying again for up to %g s (%s)",
                        self.endpoint,
                        type(exc).__name__,
                        window,
                        setting,
                    )
                if retry and isinstance(exc, RETRY_ERRORS) and clock.wait():
                    continue
                tried = f" (tried {clock.tries + 1} times)" if clock.tries else ""
                hint = ""
                if isinstance(exc, CONNECT_ERRORS) and self._never_answered():
                    hint = (
                        "; nothing has answered at this address from this machine before: check the endpoint "
                        "(KILN_ENDPOINT, or `kiln login`)"
                    )
                raise KilnError(f"cannot reach Kiln at {self.endpoint}: {exc}{tried}{hint}") from exc
            if not self._job_token:
                reached.note(self.endpoint)
            if retry and response.status_code in RETRY_STATUSES and clock.wait(retry_after(response)):
                continue
            break
        self._raise_for(response)
        return response

    def _never_answered(self) -> bool:
        """A key-signed client's endpoint that never answered this machine (kiln.sdk.reached): a connection it
        cannot make is retried for ``first_contact_seconds`` only. A job's calls always get the whole window."""
        return not self._job_token and not reached.seen(self.endpoint)

    def _send(
        self,
        method: str,
        path: str,
        params: dict[str, Any] | None,
        body: bytes | None,
        content: Any,
        unsigned: bool,
        content_sha256: str | None,
        extra_headers: dict[str, str],
    ) -> httpx.Response:
        """One try of ``request``, signed now: a retry is a new request to the server, with its own date and nonce
        (the server refuses a nonce it has seen)."""
        url, headers = self._prepare(method, path, params, body, unsigned, content_sha256)
        headers.update(extra_headers)
        response = self._http.request(method, url, content=body if body is not None else content, headers=headers)
        if method == "HEAD" and response.status_code >= 400 and response.status_code != 404:
            # A HEAD answer has no body: ask again with GET for the server's error (a refusal reads the same).
            url, headers = self._prepare("GET", path, params, b"", False)
            with self._http.stream("GET", url, headers={**headers, **extra_headers}) as again:
                if again.status_code >= 400:
                    response = again
                    response.read()
        return response

    def signed_headers(self, method: str, url_path: str, query: str = "", body: bytes = b"") -> dict[str, str]:
        """The headers that sign a request to ``url_path`` outside /api/v1 (a notebook's JupyterLab through Kiln's
        proxy, or the WebSocket handshake of its kernel channels, signed as a GET with an empty body); ``query``
        as sent, RFC 3986 encoded."""
        if self._job_token:
            return {"Authorization": f"Bearer {self._job_token}"}
        return signing.sign_headers(
            access_key=self.access_key,
            secret_key=self._secret_key,
            method=method,
            path=httpx.URL(self.endpoint + url_path).raw_path.decode(),
            query=query,
            content_sha256=signing.body_sha256(body),
        )

    def _raise_for(self, response: httpx.Response) -> None:
        """The server's error as the same ``kiln.errors`` class, its message kept; a refused authentication
        also says what to check (the endpoint, the key and where each came from: ``kiln.sdk.credentials``)."""
        if response.status_code < 400:
            return
        try:
            body = response.json()
        except ValueError:
            body = response.text
        error = error_from_body(response.status_code, body)
        if isinstance(error, Unauthenticated):
            error = self._credentials.explain(error)
        raise error

    # -- identity -------------------------------------------------------------------------------------

    def whoami(self) -> WhoAmI:
        return WhoAmI.model_validate(self.request("GET", "/whoami").json())

    # -- code -----------------------------------------------------------------------------------------

    def has_blob(self, sha256: str) -> bool:
        try:
            self.request("HEAD", f"/blobs/{sha256}")
            return True
        except NotFound:
            return False

    def upload_blob(self, path: Path, sha256: str, progress: Progress | None = None) -> None:
        """Upload a bundle unless the server already has it (content-addressed)."""
        if self.has_blob(sha256):
            if progress:
                progress(path.stat().st_size)
            return

        def chunks() -> Iterator[bytes]:
            with open(path, "rb") as fh:
                while data := fh.read(1024 * 1024):
                    if progress:
                        progress(len(data))
                    yield data

        self.request(
            "PUT",
            f"/blobs/{sha256}",
            content=chunks(),
            unsigned=True,
            extra_headers={"Content-Type": "application/gzip", "Content-Length": str(path.stat().st_size)},
        )

    def upload_code(
        self, directory: Path, *, max_bytes: int = DEFAULT_MAX_CODE_BYTES, progress: Progress | None = None
    ) -> str:
        """Package ``directory`` (honouring .gitignore/.kilnignore), upload it, return its sha256."""
        bundle = build_bundle(directory, max_bytes)
        try:
            self.upload_blob(bundle.path, bundle.sha256, progress)
        finally:
            bundle.path.unlink(missing_ok=True)
        return bundle.sha256

    # -- jobs -----------------------------------------------------------------------------------------

    def submit(
        self, spec: JobSpec | dict[str, Any], code_sha256: str | None = None, *, idempotency_key: str | None = None
    ) -> JobRead:
        """Submit a job (its code uploaded already, as ``code_sha256``; ``run`` packs and uploads it). Sent with
        ``idempotency_key`` (by default a new one per call) and retried with it: a retry never makes a second
        job. Give your own key to make a retry of the whole call harmless too (your process restarted, say)."""
        spec = spec if isinstance(spec, JobSpec) else JobSpec.model_validate(spec)
        body = JobSubmit(spec=spec, code_sha256=code_sha256).model_dump(mode="json", exclude_none=True)
        key = new_key() if idempotency_key is None else idempotency_key
        return JobRead.model_validate(self.request("POST", "/jobs", json_body=body, idempotency_key=key).json())

    def get_job(self, job_id: str) -> JobRead:
        return JobRead.model_validate(self.request("GET", f"/jobs/{job_id}").json())

    def list_jobs(self, *, states: list[str] | None = None, limit: int = 50) -> list[JobRead]:
        data = self.request("GET", "/jobs", params={"state": states, "limit": limit}).json()
        return [JobRead.model_validate(j) for j in data["items"]]

    def events(self, job_id: str) -> list[EventRead]:
        data = self.request("GET", f"/jobs/{job_id}/events").json()
        return [EventRead.model_validate(e) for e in data["items"]]

    def why(self, job_id: str) -> WhyRead:
        """Why the job is where it is: for a waiting job its queue position, the limit that holds it (quota,
        capacity, gang, priority, reservation, preemption, node selector) with the numbers, and what is ahead."""
        return WhyRead.model_validate(self.request("GET", f"/jobs/{job_id}/why").json())

    def cancel(self, job_id: str) -> JobRead:
        return JobRead.model_validate(self.request("POST", f"/jobs/{job_id}/cancel").json())

    def wait(self, job_id: str, timeout: float | None = None, poll: float = 0.25) -> JobRead:
        """Block until the job ends (or ``timeout`` seconds pass: TimeoutError)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get_job(job_id)
            if JobState(job.state).terminal:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {job.state} after {timeout}s")
            time.sleep(poll)

    def read_logs(self, job_id: str, offset: int = 0) -> tuple[bytes, int, bool]:
        """(stored log lines from ``offset``, next offset, job ended)."""
        r = self.request("GET", f"/jobs/{job_id}/logs", params={"offset": offset})
        return r.content, int(r.headers["X-Kiln-Next-Offset"]), r.headers.get("X-Kiln-Job-Ended") == "true"

    def stream_logs(self, job_id: str, *, follow: bool = True, offset: int = 0) -> Iterator[LogLine]:
        """The job's log from byte ``offset`` as ``kiln.sdk.logs.LogLine`` records (time, source stdout/stderr/kiln,
        worker, attempt, text); ``print(line)`` shows one as a person reads it. With ``follow`` until the job ends."""
        # Lines end with "\n" only: a "\r" inside a line (progress bars) is part of its text.
        parser = LogParser()
        if not follow:
            while True:
                data, next_offset, _ = self.read_logs(job_id, offset)
                if not data:
                    return
                yield from map(parser.parse, filter(None, data.decode(errors="replace").split("\n")))
                offset = next_offset
        url, headers = self._prepare("GET", f"/jobs/{job_id}/logs", {"offset": offset, "follow": True}, b"", False)
        pending = b""
        with self._stream(url, headers, httpx.Timeout(30.0, read=None)) as response:
            try:
                for chunk in response.iter_bytes():
                    pending += chunk
                    *lines, pending = pending.split(b"\n")
                    for line in lines:
                        if line:
                            yield parser.parse(line.decode(errors="replace"))
            except httpx.TransportError as exc:
                raise KilnError(f"lost the connection to Kiln at {self.endpoint}: {exc}") from exc
        if pending:
            yield parser.parse(pending.decode(errors="replace"))

    @contextmanager
    def _stream(
        self, url: str, headers: dict[str, str], timeout: httpx.Timeout | None = None
    ) -> Iterator[httpx.Response]:
        """A streamed GET whose errors are Kiln errors (HTTP ones mapped, transport ones wrapped)."""
        try:
            with self._http.stream("GET", url, headers=headers, timeout=timeout or self._http.timeout) as response:
                if response.status_code >= 400:
                    response.read()
                    self._raise_for(response)
                yield response
        except httpx.TransportError as exc:
            raise KilnError(f"cannot reach Kiln at {self.endpoint}: {exc}") from exc

    def artifacts(self, job_id: str) -> list[ArtifactRead]:
        data = self.request("GET", f"/jobs/{job_id}/artifacts").json()
        return [ArtifactRead.model_validate(a) for a in data["items"]]

    def tensorboard_images(self, job_id: str) -> TensorBoardImageList:
        """The images in the job's TensorBoard event files (``add_image``, ``tf.summary.image``), sorted by tag and
        step: each names its event file, offset and index, which ``tensorboard_image`` takes."""
        return TensorBoardImageList.model_validate(self.request("GET", f"/jobs/{job_id}/tensorboard-images").json())

    def tensorboard_image(self, job_id: str, file: str, offset: int, index: int = 0) -> bytes:
        """One image's bytes (PNG, JPEG, GIF or WebP), as ``tensorboard_images`` listed it."""
        params = {"file": file, "offset": offset, "index": index}
        return self.request("GET", f"/jobs/{job_id}/tensorboard-images/image", params=params).content

    def download(
        self,
        job_id: str,
        dest: Path,
        path: str | None = None,
        progress: Progress | None = None,
    ) -> list[Path]:
        """Download the job's artifacts (all, or those at/under ``path``) into ``dest``; returns the files."""
        wanted = [
            a
            for a in self.artifacts(job_id)
            if path is None or a.path == path.strip("/") or a.path.startswith(path.strip("/") + "/")
        ]
        if path is not None and not wanted:
            raise NotFound(f"job {job_id} has no artifact at {path!r}")
        written = []
        for artifact in wanted:
            target = (dest / artifact.path).resolve()
            if dest.resolve() not in target.parents:
                raise KilnError(f"refusing to write outside {dest}: {artifact.path}")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(target.name + ".part")
            url, headers = self._prepare(
                "GET", f"/jobs/{job_id}/artifacts/{quote(artifact.path, safe='/')}", None, b"", False
            )
            with self._stream(url, headers) as response, open(tmp, "wb") as fh:
                for chunk in response.iter_bytes(1024 * 1024):
                    fh.write(chunk)
                    if progress:
                        progress(len(chunk))
            tmp.replace(target)
            written.append(target)
        mark_download(dest, job_id, written)  # so that `kiln run` here does not pack them as code
        return written

    # -- metrics --------------------------------------------------------------------------------------

    @staticmethod
    def _metric_params(
        names: list[str] | str | None,
        downsample: int | None,
        worker: str | None,
        step_min: int | None,
        step_max: int | None,
        format: str | None = None,
    ) -> dict[str, Any]:
        joined = names if isinstance(names, str) or names is None else ",".join(names)
        params = {"names": joined or None, "downsample": downsample, "worker": worker}
        return params | {"step_min": step_min, "step_max": step_max, "format": format}

    def metrics(
        self,
        job_id: str,
        names: list[str] | str | None = None,
        downsample: int | None = None,
        worker: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
    ) -> list[MetricSeriesData]:
        """A job's series as ``[step, time, value]`` points; ``downsample`` keeps at most that many per series
        (shape-preserving: first, last, min and max are always kept)."""
        params = self._metric_params(names, downsample, worker, step_min, step_max)
        return MetricsData.model_validate(self.request("GET", f"/jobs/{job_id}/metrics", params=params).json()).series

    def metrics_summary(self, job_id: str) -> list[MetricSeriesSummary]:
        """Per series: count, first and last step, last value, min and max."""
        data = self.request("GET", f"/jobs/{job_id}/metrics/summary").json()
        return MetricsSummary.model_validate(data).series

    def compare_metrics(
        self, job_ids: list[str], names: list[str] | str | None = None, downsample: int | None = None
    ) -> dict[str, list[MetricSeriesData]]:
        """The same metrics of several jobs, by job id (NotFound if any of them is not yours to read)."""
        params = self._metric_params(names, downsample, None, None, None) | {"jobs": ",".join(job_ids)}
        return MetricsCompare.model_validate(self.request("GET", "/metrics/compare", params=params).json()).jobs

    def export_metrics_csv(
        self,
        job_ids: str | list[str],
        names: list[str] | str | None = None,
        downsample: int | None = None,
        worker: str | None = None,
        step_min: int | None = None,
        step_max: int | None = None,
    ) -> str:
        """CSV text ``job_id,worker,name,step,time,value`` of one job or several."""
        if isinstance(job_ids, str):
            params = self._metric_params(names, downsample, worker, step_min, step_max, "csv")
            return self.request("GET", f"/jobs/{job_ids}/metrics", params=params).text
        params = self._metric_params(names, downsample, worker, step_min, step_max, "csv") | {"jobs": ",".join(job_ids)}
        return self.request("GET", "/metrics/compare", params=params).text

    def send_metrics(self, job_id: str, lines: bytes | str) -> MetricsIngested:
        """Send spool lines (ndjson) for a job: what a job on another machine does with its token."""
        body = lines.encode() if isinstance(lines, str) else lines
        r = self.request(
            "POST", f"/jobs/{job_id}/metrics", content=body, extra_headers={"Content-Type": "application/x-ndjson"}
        )
        return MetricsIngested.model_validate(r.json())
