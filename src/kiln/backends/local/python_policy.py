"""Which interpreters ``runtime.python`` may name on the local executor, and what of the machine a job's sandbox
then shows for it.

The sandbox shows a job its runtime read-only. Were any path accepted, a job could name a directory of another
job, of the server's state or of the machine (``/var/log``) and have it, or the directories around it, shown to
it. So ``runtime.python`` names an interpreter only from what the operator allows:

- the system's interpreters under ``/usr`` (every job sees ``/usr`` anyway);
- interpreters and virtualenvs in the directories of ``KILN_ALLOWED_PYTHON_ROOTS``;
- the catalog's runtimes (their venvs in the runtimes directory).

The path is checked as written (``..`` folded) before anything on the machine is looked at, so a refusal reads
the same whether the path exists or not; then again once symlinks are followed. Whatever the roots say, nothing in
$KILN_HOME (the jobs' directories, the server's keys and database), the runtimes directory or a local object
store is allowed, except the catalog's venvs; nothing in the jobs' directory ever. A virtualenv's base
installation (``pyvenv.cfg``'s ``home``) must be allowed too.

What the sandbox then binds (:attr:`Interpreter.roots`) is the virtualenv's directory (else the interpreter's bin
directory) and the installation prefix of the real interpreter and of the venv's base, each cut down to the
allowed root that holds it, and never a directory that holds a forbidden one.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from kiln.errors import RuntimeUnavailable
from kiln.settings import Settings

SYSTEM_ROOT = "/usr"
FIELD = {"field": "spec.runtime.python"}


def under(path: str, top: str) -> bool:
    """``path`` is ``top`` or inside it (both absolute and normalised)."""
    return path == top or path.startswith(top.rstrip("/") + "/")


def _norm(path: str | Path) -> str:
    text = os.path.normpath(str(path))
    return "/" + text.lstrip("/") if text.startswith("//") else text  # POSIX keeps a leading "//"


def _both(paths: Iterable[str | Path]) -> tuple[str, ...]:
    """Each path as written and as it really is (a root given through a symlink holds what the link's target
    holds)."""
    out: list[str] = []
    for path in paths:
        for form in (_norm(path), os.path.realpath(path)):
            if form not in out:
                out.append(form)
    return tuple(out)


def base_python() -> str:
    """The real interpreter behind this one (a venv's base), used to create runtime venvs."""
    return str(getattr(sys, "_base_executable", None) or sys.executable)


def prefix(interpreter: str) -> str:
    """The installation an interpreter belongs to: ``/opt/py/bin/python3`` → ``/opt/py``."""
    return os.path.dirname(os.path.dirname(interpreter))


def venv_home(venv: str) -> str | None:
    """``home`` of the virtualenv at ``venv`` (the base interpreter's bin directory), or None if it is none."""
    try:
        text = Path(venv, "pyvenv.cfg").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "home" and value.strip():
            return value.strip()
    return None


@dataclass(frozen=True)
class Interpreter:
    python: str  # the interpreter the job's commands use
    bin_dir: str  # first on the job's PATH
    roots: tuple[str, ...]  # what the sandbox binds read-only for it (the system's /usr left out)


@dataclass(frozen=True)
class PythonPolicy:
    roots: tuple[str, ...] = ()  # KILN_ALLOWED_PYTHON_ROOTS, as given and real
    never: tuple[str, ...] = ()  # the jobs' directory: refused whatever else is said
    private: tuple[str, ...] = ()  # $KILN_HOME, the runtimes dir, a local store: refused but for the catalog's venvs
    server_base: str | None = None  # the installation of the server's interpreter, that catalog venvs are made from

    @classmethod
    def from_settings(cls, settings: Settings, store_root: str | None = None) -> PythonPolicy:
        private: list[str | Path] = [settings.home, settings.resolved_runtimes_dir]
        if store_root:
            private.append(store_root)
        return cls(
            roots=_both(settings.allowed_python_roots),
            never=_both([settings.jobs_dir]),
            private=_both(private),
            server_base=prefix(os.path.realpath(base_python())),
        )

    def describe(self) -> str:
        """Where an allowed interpreter may be, for the messages."""
        listed = ", ".join(dict.fromkeys([SYSTEM_ROOT, *self.roots]))
        return (
            f"name an interpreter under the allowed roots {listed} (an operator adds roots with "
            "KILN_ALLOWED_PYTHON_ROOTS; none in the server's or the jobs' directories), or use a catalog runtime "
            "(runtime.framework; kiln runtimes list)"
        )

    def refused(self, name: str) -> RuntimeUnavailable:
        """The one refusal of a path not allowed: the same words whether it exists or not."""
        return RuntimeUnavailable(
            f"runtime.python: {name} is not allowed on this server; {self.describe()}", details=FIELD
        )

    def forbidden(self, path: str, venvs: tuple[str, ...]) -> bool:
        if any(under(path, top) for top in self.never):
            return True
        return any(under(path, top) for top in self.private) and not any(under(path, v) for v in venvs)

    def holds_forbidden(self, path: str) -> bool:
        return any(under(top, path) for top in (*self.never, *self.private))

    def allowed(self, path: str, extra: tuple[str, ...]) -> bool:
        """``path`` (normalised, or real) lies in an allowed root or in ``extra`` (the catalog's venvs)."""
        return any(under(path, top) for top in (SYSTEM_ROOT, *self.roots, *extra))

    def resolve(self, name: str, catalog_venvs: Iterable[str | Path]) -> Interpreter:
        """The interpreter ``name`` (a path, or a name on the server's PATH) names, if it is allowed, with the
        directories the sandbox must show for it; RuntimeUnavailable (details: the field) otherwise."""
        path = name
        if "/" not in name:
            found = shutil.which(name)
            if found is None:
                raise RuntimeUnavailable(
                    f"runtime.python: no {name!r} on the server's PATH; {self.describe()}", details=FIELD
                )
            path = found
        if not os.path.isabs(path):
            raise self.refused(name)
        venvs = tuple(_norm(v) for v in catalog_venvs)
        lexical = _norm(path)
        # Nothing on the machine is looked at before this: the answer says nothing of what exists where.
        if not self.allowed(lexical, venvs) or self.forbidden(lexical, venvs):
            raise self.refused(name)
        real_venvs = tuple(dict.fromkeys((*venvs, *(os.path.realpath(v) for v in venvs))))
        catalog = any(under(lexical, v) for v in venvs)
        # A catalog venv's interpreter is the server's own base interpreter.
        targets = (*real_venvs, self.server_base) if catalog and self.server_base else real_venvs

        def ok(real: str, extra: tuple[str, ...] = real_venvs) -> bool:
            return self.allowed(real, extra) and not self.forbidden(real, real_venvs)

        real = os.path.realpath(lexical)
        bin_dir = os.path.realpath(os.path.dirname(lexical))
        if not ok(real, targets) or not ok(bin_dir):
            raise self.refused(name)
        if not os.path.isfile(real) or not os.access(real, os.X_OK):
            raise RuntimeUnavailable(f"runtime.python: no such executable: {name}", details=FIELD)
        wanted: list[tuple[str, str]] = []  # (directory to show, the path in it that must be shown)
        venv = os.path.dirname(bin_dir)
        home = venv_home(venv) if ok(venv) else None
        if home is not None:
            wanted.append((venv, venv))
            base = os.path.realpath(home)
            if not ok(base, targets):
                raise RuntimeUnavailable(
                    f"runtime.python: {name} is a virtualenv made from {home}, which is not allowed on this server; "
                    f"make it from an interpreter that is: {self.describe()}",
                    details=FIELD,
                )
            wanted.append((os.path.dirname(base), base))
        else:
            wanted.append((bin_dir, bin_dir))
        wanted.append((prefix(real), real))
        roots = [self._within(top, inner, targets) for top, inner in wanted]
        for root in roots:
            if self.holds_forbidden(root) or self.forbidden(root, real_venvs):
                raise RuntimeUnavailable(
                    f"runtime.python: {name} lies in {root}, which holds the server's own files; the operator must "
                    "install it elsewhere",
                    details=FIELD,
                )
        return Interpreter(
            python=os.path.join(bin_dir, os.path.basename(lexical)),
            bin_dir=bin_dir,
            roots=outermost(r for r in roots if not under(r, SYSTEM_ROOT)),
        )

    def _within(self, top: str, inner: str, extra: tuple[str, ...]) -> str:
        """``top``, or where it reaches above every allowed root, the outermost allowed root holding ``inner``
        (an interpreter right in a root: its parent is not the operator's to show)."""
        tops = (SYSTEM_ROOT, *self.roots, *extra)
        if any(under(top, t) for t in tops):
            return top
        return min((t for t in tops if under(inner, t)), key=len)

    def catalog_roots(self, venv: str, base_pythons: Iterable[str]) -> tuple[str, ...]:
        """What the sandbox shows for a catalog runtime: its venv, and the installations it is made from (the
        server's interpreter; the ``home`` its ``pyvenv.cfg`` names, when that is allowed)."""
        real_venv = os.path.realpath(venv)
        roots = [real_venv, *(prefix(os.path.realpath(p)) for p in base_pythons)]
        home = venv_home(real_venv)
        if home is not None:
            base = os.path.realpath(home)
            extra = (self.server_base,) if self.server_base else ()
            if self.allowed(base, extra) and not self.forbidden(base, ()):
                roots.append(os.path.dirname(base))
        kept = [r for r in roots if r not in ("/", "") and not self.holds_forbidden(r)]
        return outermost(r for r in kept if not under(r, SYSTEM_ROOT))


def outermost(paths: Iterable[str]) -> tuple[str, ...]:
    """``paths`` without those inside another of them."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(under(path, k) for k in kept):
            kept.append(path)
    return tuple(sorted(kept))
