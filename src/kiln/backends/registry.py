"""Backends by name (``KILN_BACKEND``): each is a ``module:Class`` loaded only when it is asked for, so that a
backend whose dependencies are missing costs nothing until it is chosen, and is then reported by name with the
error that stopped it (never silently dropped)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from kiln.backends.base import Backend, BackendDeps
from kiln.backends.capabilities import declared
from kiln.errors import BackendUnavailable

BACKENDS: dict[str, str] = {
    "local": "kiln.backends.local.executor:LocalBackend",
    "kubernetes": "kiln.backends.kubernetes.backend:KubernetesBackend",
    "slurm": "kiln.backends.slurm.backend:SlurmBackend",
}


@dataclass(frozen=True)
class BackendInfo:
    """One registered backend, as :func:`listing` found it."""

    name: str
    target: str  # module:Class
    loaded: bool
    error: str | None  # why it could not be loaded
    capabilities: frozenset[str]


def _import(name: str, target: str) -> type[Backend]:
    module_name, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailable(
            f"KILN_BACKEND={name}: cannot load: {type(exc).__name__}: {exc}", details={"backend": name}
        ) from exc
    if not (isinstance(cls, type) and issubclass(cls, Backend)):
        raise BackendUnavailable(f"KILN_BACKEND={name}: cannot load: {target} is not a Backend")
    return cls


def load(name: str, backends: dict[str, str] | None = None) -> type[Backend]:
    """The class of the backend called ``name``; BackendUnavailable names it and says why it cannot be had."""
    registered = BACKENDS if backends is None else backends
    target = registered.get(name)
    if target is None:
        raise BackendUnavailable(
            f"KILN_BACKEND={name}: no such backend; the backends are {', '.join(sorted(registered))}",
            details={"backend": name},
        )
    return _import(name, target)


def create(name: str, deps: BackendDeps, backends: dict[str, str] | None = None) -> Backend:
    """The backend called ``name``, built from the server's settings."""
    return load(name, backends).from_settings(deps)


def listing(backends: dict[str, str] | None = None) -> list[BackendInfo]:
    """Every registered backend: whether it loads (and if not, why) and the capabilities it declares."""
    found = []
    for name, target in (BACKENDS if backends is None else backends).items():
        try:
            cls = _import(name, target)
        except BackendUnavailable as exc:
            found.append(BackendInfo(name, target, False, exc.message, frozenset()))
        else:
            found.append(BackendInfo(name, target, True, None, declared(cls)))
    return found
