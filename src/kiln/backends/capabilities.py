"""What a backend may do beyond the contract of :class:`kiln.backends.base.Backend`: one mixin per optional
capability. A backend declares a capability by inheriting its mixin, and callers check it with ``isinstance``
(``isinstance(backend, Preemptible)``); a backend without it is never asked. There are no no-op defaults: what a
backend does not declare, it does not do.

The same contract applies as for the base class: return fast, be idempotent where it says so, raise
``BackendError(retryable=True)`` for "not yet".
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from kiln.domain.catalog import Catalog, CatalogEntry
from kiln.domain.runtime_builds import BuildInfo
from kiln.domain.serving import ServiceSpec
from kiln.domain.spec import JobSpec


class SpecValidator(abc.ABC):
    """Refuses at submit what the backend can never run."""

    @abc.abstractmethod
    def validate(self, spec: JobSpec) -> None:
        """Raise InvalidInput for what this backend can never run, e.g. an image on a process executor."""


class Preemptible(abc.ABC):
    """Stops an attempt for a higher-priority job differently from a cancel (a notice, a reason of its own).
    The scheduler cancels the attempts of a backend without it."""

    @abc.abstractmethod
    def preempt(self, handle: dict[str, Any], reason: str, grace_seconds: float) -> None:
        """Ask the attempt to stop because a higher-priority job needs its resources: warn it (the file named by
        $KILN_NOTICE_FILE, where the backend has one), SIGTERM, SIGKILL after the grace. Idempotent. The attempt
        then ends with the reason ``Preempted``."""


class OutputsNotKept(Exception):
    """An attempt's outputs are refused whole, before any of them is written to the store: the message says why
    (the job's disk limit, the organisation's storage quota), naming the sizes."""


class OutputCollector(abc.ABC):
    """The server copies an attempt's outputs into the store (a backend whose jobs upload their outputs
    themselves, as Kubernetes pods do, does not have it)."""

    @abc.abstractmethod
    def collect_outputs(
        self, handle: dict[str, Any], dest_prefix: str, admit: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        """Copy what the attempt wrote to $KILN_OUTPUT_DIR into the artifact store under ``dest_prefix``, all of
        it or nothing. Idempotent. Sizes are apparent sizes (a sparse file costs the store all of its length):
        ``admit`` is called with their sum before anything is written and raises ``OutputsNotKept`` to refuse
        them; so does the backend for outputs over the job's disk limit. Returns (files, bytes)."""


class CheckpointSyncer(abc.ABC):
    """The server copies a job's checkpoints into the store, while it runs and when each attempt ends (a
    backend whose jobs upload their checkpoints themselves does not have it)."""

    @abc.abstractmethod
    def sync_checkpoints(
        self, handle: dict[str, Any], dest_prefix: str, admit: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        """Copy what changed in the $KILN_CHECKPOINT_DIR of the job whose attempt ``handle`` names since the last
        call into the store under ``dest_prefix``, so checkpoints survive the machine and reach the next attempt.
        The handle, not the job id: the attempt may be one another server started (and this one adopted), with
        its files where that server put them. When anything changed, ``admit`` is called before any byte is
        written with what the store will then hold under ``dest_prefix`` (apparent sizes; a file copied again
        replaces its older copy), and raises ``OutputsNotKept`` to refuse the whole sync. Returns (files copied,
        bytes the store holds under ``dest_prefix`` after them; 0 when nothing changed)."""


class EventSyncer(abc.ABC):
    """The server copies a job's TensorBoard event files into the store, while it runs and when each attempt ends
    (what ``kiln tensorboard`` reads)."""

    @abc.abstractmethod
    def sync_events(
        self, handle: dict[str, Any], dest_prefix: str, admit: Callable[[int], None] | None = None
    ) -> tuple[int, int]:
        """Copy the ``events.out.tfevents.*`` files under the job's TensorBoard dir that changed since the last
        call into the store under ``dest_prefix``. Before each file is written, ``admit`` is called with the bytes
        then kept for the job in all, and raises ``OutputsNotKept`` to leave that file out. Returns (files copied,
        bytes kept for the job in all)."""


@dataclass
class Work:
    """One piece of a backend's background work, run by the server's task runner as a task named ``name`` on every
    server (it is this machine's, or this process's): ``step()`` does a bounded piece (it returns within about a
    second, so that the server stops promptly) and returns the seconds until the next step (0: at once; None:
    ``interval``). Setting ``wake`` runs the next step before then. A step that blocks on a stream longer than
    that (a Kubernetes watch) says how to cut it short when the server stops: ``interrupt``."""

    name: str
    step: Callable[[], float | None]
    interval: float
    wake: threading.Event = field(default_factory=threading.Event)
    interrupt: Callable[[], None] | None = None


class BackgroundWork(abc.ABC):
    """Needs work done while the server runs (listening for its attempts' notes, making ready ahead what attempts
    will need). The backend starts no thread of its own: the server's task runner runs each piece
    (kiln.tasks.backend_work), after every part of the server is built, and stops it before ``close``."""

    @abc.abstractmethod
    def background_work(self) -> Sequence[Work | WorkSet]:
        """The pieces, each run as a task of its own."""


@dataclass
class WorkSet:
    """Background work with one piece per key that is live now (a pod whose log is followed), run by the server's
    task runner as one task named ``name``: the runner reads ``keys()`` every ``interval`` seconds, or at once when
    ``wake`` is set, and runs each new key's ``step(key)`` on a thread of its own, as it runs a :class:`Work`'s step
    (it returns the seconds until the next step; 0: at once; None: ``interval``), until the key is gone from
    ``keys()``: a step says its key's work is done by taking its key out. A step may block on one stream for as
    long as the stream lasts; ``interrupt`` cuts every such step short when the server stops. So a backend with a
    thing to follow per pod or per attempt still starts no thread of its own."""

    name: str
    keys: Callable[[], Collection[str]]
    step: Callable[[str], float | None]
    interval: float
    wake: threading.Event = field(default_factory=threading.Event)
    interrupt: Callable[[], None] | None = None


class WorkDirs(abc.ABC):
    """A job's directories are on this machine, where the server may read what the job leaves for it (a model
    replica's state file naming its socket)."""

    @abc.abstractmethod
    def work_dir(self, job_id: str, handle: dict[str, Any] | None) -> Path:
        """The work directory of the job whose current attempt ``handle`` names (None: none launched yet): in
        the home of whichever server on this machine launched it."""


class NotebookAddress(NamedTuple):
    """Where Kiln's notebook proxy reaches the server of a notebook's attempt (JupyterLab, TensorBoard): ``url``
    (``http://host:port``), or with ``socket`` a Unix socket on this machine (``url`` is then ``http://notebook``);
    ``token`` is the server's own, sent as ``Authorization: token …`` (never the caller's credentials)."""

    url: str
    token: str
    socket: str | None = None


class NotebookHost(abc.ABC):
    """Runs notebooks (kiln.usecases.notebooks) where Kiln's proxy can reach them: the local executor on a Unix
    socket in the job's work dir, Kubernetes behind a ClusterIP Service per notebook."""

    @abc.abstractmethod
    def notebook_address(self, job_id: str, handle: dict[str, Any] | None) -> NotebookAddress | None:
        """Where the notebook server of the job's attempt ``handle`` answers; None while it is not there yet
        (the launcher has not said where, the Service has no address)."""


class JobFiles(abc.ABC):
    """Keeps files of a job on the server's machine (work dir, outputs, checkpoints) that outlive its attempts."""

    @abc.abstractmethod
    def release(self, handle: dict[str, Any], keep: bool) -> None:
        """The job whose last attempt ``handle`` names has ended and its outputs and checkpoints are in the
        store: free its local files (where that attempt's server put them), now or (``keep``: it failed) once
        the platform's retention for debugging has passed."""

    @abc.abstractmethod
    def sweep(self) -> None:
        """Housekeeping (about once a minute): free what ``release`` kept once its retention has passed."""


class ExtractsMetrics(abc.ABC):  # noqa: B024 - a marker: the capability is a property of the attempts
    """The backend's attempts extract metrics from their own output (the local executor's shim does). Without
    it the server extracts them from the job's log in its log store (:mod:`kiln.tasks.log_metrics`)."""


class RuntimeBuilder(abc.ABC):
    """Installs catalog runtimes (virtualenvs) where its jobs run, ahead of a job's first use
    (``kiln runtimes install``), and says how each build went."""

    @property
    @abc.abstractmethod
    def runtime_catalog(self) -> Catalog:
        """The catalog the runtimes come from."""

    @abc.abstractmethod
    def runtime_path(self, entry: CatalogEntry) -> Path:
        """Where the runtime's virtualenv is (or will be)."""

    @abc.abstractmethod
    def runtime_installed(self, entry: CatalogEntry) -> bool:
        """Whether the runtime is built and ready."""

    @abc.abstractmethod
    def runtime_building(self, entry: CatalogEntry) -> bool:
        """Whether a build of the runtime holds its lock now (started by a job or through the API)."""

    @abc.abstractmethod
    def latest_runtime_build(self, entry: CatalogEntry, lock_held: bool) -> BuildInfo | None:
        """The latest build started through the API; ``lock_held``: whether a build holds the runtime's lock."""

    @abc.abstractmethod
    def latest_runtime_build_id(self, entry: CatalogEntry) -> str | None:
        """The id of the latest build started through the API, if any."""

    @abc.abstractmethod
    def read_runtime_build(self, entry: CatalogEntry, build_id: str) -> BuildInfo:
        """What the files of one build say about it."""

    @abc.abstractmethod
    def read_runtime_build_log(self, entry: CatalogEntry, build_id: str, offset: int, limit: int) -> tuple[bytes, int]:
        """Whole lines of the build's log from ``offset`` (at most ``limit`` bytes unless one line is longer), and
        the next offset."""

    @abc.abstractmethod
    def start_runtime_build(self, entry: CatalogEntry) -> None:
        """Build the runtime in the background (a build already running through the API is left to run)."""


class ServiceAddress(NamedTuple):
    """Where Kiln's router reaches a deployed service: ``POST {url}/predict`` with ``Authorization: Bearer
    {secret}``."""

    url: str
    secret: str


DeployTrack = Literal["stable", "canary", "shadow"]


class ServiceDeployer(abc.ABC):
    """Runs a model service's replicas itself, as objects of its own (a Kubernetes Deployment behind a Service),
    where a backend without it runs each replica as a job. The serving task then applies the service's spec to
    it, routes predicts to the URL it answers with, and reads how many replicas are ready; rolling updates,
    restarts and autoscaling (between the spec's min and max) are the backend's.

    A service runs up to three **tracks**, each a deployment of its own with its own address: ``stable`` (the
    service's model version and replicas), and while the service has one, ``canary`` (the canary's version, its
    ``canary_replicas``, never autoscaled) and ``shadow`` (the shadow's version, one replica). Kiln's router splits
    the predicts between the tracks' addresses (weights, sticky keys, a targeted version, shadow copies), as it
    does between local replicas: the backend never weighs one track against another. Every track of a service
    accepts the same secret."""

    @abc.abstractmethod
    def apply_service(
        self,
        service_id: str,
        org_id: str,
        spec: ServiceSpec,
        model: tuple[str, int],
        revision: int,
        code_sha256: str | None,
        track: DeployTrack = "stable",
    ) -> ServiceAddress:
        """Create the objects of the service's ``track``, or replace them with what this spec renders to: a new
        ``revision`` (another model version or spec) rolls its replicas one at a time, ``spec.replicas`` scales
        them. Idempotent: the same arguments again change nothing. ``model``: the version the track runs (name,
        number); ``code_sha256``: the code bundle of a custom predictor. Returns where the router sends that
        track's predicts, with the secret every request carries (the same for every revision and every track of
        the service). A canary or shadow track is applied after the stable one (it may share its objects)."""

    @abc.abstractmethod
    def service_ready(self, service_id: str, track: DeployTrack = "stable") -> int:
        """How many replicas of the track's latest applied revision are ready (0 while a new revision has none
        ready yet, or the track does not exist)."""

    @abc.abstractmethod
    def delete_service(self, service_id: str, track: DeployTrack | None = None) -> None:
        """Delete every object of the service (``track`` None), or of one of its canary or shadow tracks only
        (the stable track goes with the service). Idempotent: deleting what is gone deletes nothing."""


CAPABILITIES: tuple[type[abc.ABC], ...] = (
    SpecValidator,
    Preemptible,
    OutputCollector,
    CheckpointSyncer,
    EventSyncer,
    JobFiles,
    ExtractsMetrics,
    RuntimeBuilder,
    ServiceDeployer,
    NotebookHost,
)


def declared(backend: object) -> frozenset[str]:
    """The names of the capabilities ``backend`` (an instance or a class) declares, e.g. {"Preemptible"}."""
    cls = backend if isinstance(backend, type) else type(backend)
    return frozenset(c.__name__ for c in CAPABILITIES if issubclass(cls, c))


class MetricSpools(abc.ABC):
    """The backend's attempts spool their metrics into files on this machine (one writer per file, named
    ``<src>-a<attempt>-<member>.jsonl``: kiln.injob.spool), which the server's ingester reads
    (kiln.tasks.metrics_ingest). Where those files are is the backend's layout, found from the attempt's handle:
    the server that reads them may not be the one that launched the attempt (it adopted the job), and each server
    on a machine has a home of its own. A backend without it spools nothing; the server then extracts a job's
    metrics from its log into spool files of its own (kiln.metrics.spools.ServerSpools)."""

    @abc.abstractmethod
    def metric_spool(self, job_id: str, handle: dict[str, Any] | None) -> Path:
        """The directory of the spool files of the job whose current attempt ``handle`` names (None: none
        launched yet): in the home of whichever server on this machine launched it. It may not exist yet."""

    @abc.abstractmethod
    def remove_metric_spool(self, job_id: str, handle: dict[str, Any] | None) -> None:
        """Remove the job's spool files (it is being deleted: no point of it may be stored after this).
        Idempotent: removing what is gone removes nothing."""
