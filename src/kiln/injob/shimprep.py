"""Getting an attempt ready and collecting its metrics: the runtime, the code, the input datasets, metrics glue.

Standard library only, like the shim that loads it (as ``kiln.injob.shimprep`` in the package, or as a plain
module from this file's directory when the shim runs as a script). The heavier modules next to it, ``extract``
(metrics) and ``stage`` (datasets), are loaded by ``load_sibling`` only when an attempt needs them.
``Preparation`` holds the shim's methods for these; ``load_extract`` and ``load_stage`` are re-exported by
``shim.py``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

if __package__:
    from kiln.injob import proctree as _proctree
    from kiln.injob import shimio as _shimio
    from kiln.injob import tarlinks as _tarlinks
    from kiln.injob import units as _units
else:  # loaded by the shim run as a script: its directory is on sys.path
    import proctree as _proctree  # type: ignore[no-redef]
    import shimio as _shimio  # type: ignore[no-redef]
    import tarlinks as _tarlinks  # type: ignore[no-redef]
    import units as _units  # type: ignore[no-redef]


def _seconds(value: object, default: float, most: float) -> float:
    return min(most, max(0.0, float(value))) if isinstance(value, int | float) else default


def _built_with(ready: str) -> list[str] | None:
    """The packages a runtime's ``.kiln-ready`` says it was built with; None when it is not built."""
    try:
        with open(ready) as fh:
            built = json.load(fh)
    except (OSError, ValueError):
        return None
    packages = built.get("packages") if isinstance(built, dict) else None
    return [str(p) for p in packages] if isinstance(packages, list) else []


def load_sibling(name: str) -> Any:
    """The module ``name`` next to this file: ``kiln.injob.<name>`` in the package; as a script (run with -I,
    so its own directory is not on sys.path unless the shim put it there) a plain module from this directory."""
    if __package__:
        return importlib.import_module(f"kiln.injob.{name}")
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.append(here)
    return importlib.import_module(name)


def load_extract() -> Any:
    """The metrics module, next to this file; only imported when an attempt wants metrics."""
    return load_sibling("extract")


def load_stage() -> Any:
    """The dataset staging module, next to this file; only imported when an attempt has inputs."""
    return load_sibling("stage")


class Preparation(_shimio.AttemptFiles, _proctree.ProcessTree):
    """The shim's steps around the job's command: runtime, code, inputs and metrics (a mixin of ``Shim``)."""

    metrics: Any
    log_start: int  # the log's size when the attempt began
    stage_stop: threading.Event
    stage_holder: str
    stopped_as: str
    run_step: Callable[..., tuple[int, str]]
    job_processes: Callable[[], list[int]]

    # -- runtime and code -----------------------------------------------------------------------------

    def build_runtime(self, spec: dict) -> None:
        """Build a managed virtualenv once; concurrent jobs wait on a lock and reuse it. One built from another
        package list (the catalog's entry changed since: mlflow-skinny added to sklearn and pytorch) is brought to
        this one in place, with pip, rather than rebuilt: jobs running in it keep their files, and what it has
        already (torch) is not installed again. The time spent here on a runtime that was not ready (building
        it, or waiting for another job's build) is ``unbilled``: a shared runtime's build is the platform's cost,
        not that of whichever job happened to need it first."""
        venv = spec["venv"]
        ready = os.path.join(venv, ".kiln-ready")
        if _built_with(ready) == spec["packages"]:
            return
        began = time.monotonic()
        try:
            self._build_runtime(spec, venv, ready)
        finally:
            self.unbilled += time.monotonic() - began

    def _build_runtime(self, spec: dict, venv: str, ready: str) -> None:
        import fcntl
        import shutil

        os.makedirs(os.path.dirname(venv), exist_ok=True)
        with open(venv + ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            built = _built_with(ready)
            if built == spec["packages"]:
                return
            update = built is not None
            doing = "updating" if update else "building"
            self.say(f"{doing} runtime {spec['name']}: {' '.join(spec['packages']) or 'no packages'}")
            if not update:
                shutil.rmtree(venv, ignore_errors=True)
            # Built outside the sandbox and shared by every organisation's jobs: with the operator's environment
            # and the catalog's, never the job's own variables (a job's PIP_INDEX_URL must not reach it).
            env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "LC_ALL", "TZ")}
            env.update(spec.get("env", {}))
            steps = [] if update else [[spec["base_python"], "-m", "venv", venv]]
            if spec["packages"]:
                steps.append(
                    [
                        os.path.join(venv, "bin", "python"),
                        "-m",
                        "pip",
                        "install",
                        "--disable-pip-version-check",
                        "--no-input",
                        "--progress-bar",
                        "off",
                        *spec["packages"],
                    ]
                )
            for argv in steps:
                code, reason = self.run_step("runtime", argv, env, None)
                if code != 0 or reason:
                    if not update:  # an update that failed leaves the runtime as it was, still out of date
                        shutil.rmtree(venv, ignore_errors=True)
                    raise RuntimeError(f"{doing} runtime {spec['name']} failed: {' '.join(argv[:4])}… exited {code}")
            with open(ready, "w") as fh:
                json.dump({"packages": spec["packages"], "built_at": time.time()}, fh)
            self.say(f"runtime {spec['name']} ready")

    def extract_code(self) -> str | None:
        """Unpack the code into the work dir; why not when it would not fit the job's disk limit."""
        archive = self.cfg.get("code_archive")
        work = self.cfg["work_dir"]
        os.makedirs(work, exist_ok=True)
        if not archive:
            return None
        import tarfile

        with tarfile.open(archive, "r:*") as tar:
            limit = self.cfg.get("disk_limit")
            unpacked = sum(m.size for m in tar.getmembers() if m.isfile())
            if limit and unpacked > limit:
                message = (
                    f"the code unpacks to {_units.human(unpacked)}, more than the job's disk limit of "
                    f"{_units.human(limit)}"
                )
                self.say(message)
                return message
            # The "data" filter refuses absolute paths, "..", links leaving the tree and device files, but checks
            # each link against the tree extracted so far: links resolved through each other are checked first.
            why = _tarlinks.escaping_link(tar.getmembers())
            if why:
                raise tarfile.TarError(f"the code bundle is refused: {why}")
            tar.extractall(work, filter="data")
        return None

    # -- metrics --------------------------------------------------------------------------------------

    def start_metrics(self) -> None:
        """Start the metrics threads (best effort: metrics never fail an attempt); they read the log from
        ``log_start``, where the attempt's part of it begins."""
        try:
            extract = load_extract()
            self.metrics = extract.Metrics(self.cfg, self.job_processes, self.log_start)
            self.metrics.say = self.say  # e.g. that TensorBoard files are no longer read (their budget is spent)
            self.metrics.on_watched = lambda: self.notify("metrics")  # metrics.watch: the server reads them now
            # The threads share the interpreter with the loop copying the job's output: hand it back sooner.
            sys.setswitchinterval(0.0005)
            self.metrics.start()
        except Exception as exc:
            self.metrics = None
            self.say(f"metrics collection could not start: {type(exc).__name__}: {exc}")

    def stop_metrics(self) -> str | None:
        """Drain what is left of the log into metrics for a few seconds (the exit record waits that long). When
        the drain needs longer (a job that flooded its log), it goes on after the exit record: returns the marker
        file that says so to the server's ingester (created here, before the exit record). Never raises."""
        if self.metrics is None:
            return None
        try:
            mc = self.cfg["metrics"]
            drain = _seconds(mc.get("drain_seconds"), 5.0, 30.0)
            limit = _seconds(mc.get("drain_limit_seconds"), 600.0, 3600.0)
            if self.metrics.stop(drain, limit):
                return None
            marker = self.metrics.draining_marker()
            with open(marker, "w") as fh:
                fh.write(str(os.getpid()))
            return marker
        except BaseException:
            return None

    def finish_metrics(self, marker: str | None) -> None:
        """After the exit record: the rest of a long drain, then the marker goes. Never raises."""
        if marker is None or self.metrics is None:
            return
        try:
            self.metrics.wait()
        except BaseException:
            pass
        try:
            os.unlink(marker)
        except OSError:
            pass

    # -- inputs ---------------------------------------------------------------------------------------

    def stage_inputs(self, env: dict) -> dict | None:
        """Make the job's datasets available (read-only: copied into the machine's cache, or mounted) before
        anything of it runs; an outcome when that fails or the attempt is stopped meanwhile, None when the job may
        go on."""
        cfg = self.cfg
        stage = load_stage()
        self.status("staging")
        holder = f"{cfg['job_id']}-{cfg['attempt']}-{cfg.get('log_tag') or 'worker0'}"
        self.stage_holder = holder
        try:
            added = stage.stage_inputs(
                cfg["inputs"],
                cfg["data_cache"],
                cfg["work_dir"],
                log=self.say,
                stop=self.stage_stop,
                holder=holder,
                mount=cfg.get("mount"),
                helpers=self.helpers,
                exposed=not self.cfg.get("sandbox"),
            )
        except stage.StageStopped:
            stop_reason, stop_message, _ = self.stop_request()
            self.stopped_as = stop_reason
            return {"exit_code": None, "reason": stop_reason, "message": stop_message}
        except stage.StageError as exc:
            self.say(f"staging inputs failed: {exc}")
            return {"exit_code": None, "reason": "InputError", "message": str(exc)}
        env.update(added)
        return None

    def release_inputs(self) -> None:
        if not self.stage_holder:
            return
        try:
            load_stage().release(self.cfg["data_cache"], self.stage_holder)
        except Exception:
            pass  # a stale in-use record is ignored once this process is gone
