"""kiln.backends.registry: backends by name, loaded on demand; one that cannot be loaded is named with why."""

from __future__ import annotations

import pytest

from kiln.backends import registry
from kiln.backends.capabilities import Preemptible, SpecValidator, declared
from kiln.backends.kubernetes.backend import KubernetesBackend
from kiln.backends.local.executor import LocalBackend

BROKEN = {**registry.BACKENDS, "nomad": "kiln.backends.nomad.backend:NomadBackend"}


def test_the_registered_backends_load_by_name() -> None:
    assert registry.load("local") is LocalBackend
    assert registry.load("kubernetes") is KubernetesBackend


def test_a_backend_that_fails_to_import_is_listed_with_its_error() -> None:
    found = {info.name: info for info in registry.listing(BROKEN)}
    assert found["local"].loaded and found["local"].error is None
    assert found["kubernetes"].capabilities == {"SpecValidator", "Preemptible", "ServiceDeployer", "NotebookHost"}
    broken = found["nomad"]
    assert not broken.loaded and broken.capabilities == frozenset()
    assert broken.error == (
        "KILN_BACKEND=nomad: cannot load: ModuleNotFoundError: No module named 'kiln.backends.nomad'"
    )


def test_selecting_a_backend_that_fails_to_import_names_it_and_why() -> None:
    with pytest.raises(registry.BackendUnavailable) as caught:
        registry.load("nomad", BROKEN)
    assert caught.value.message == (
        "KILN_BACKEND=nomad: cannot load: ModuleNotFoundError: No module named 'kiln.backends.nomad'"
    )


def test_an_unknown_backend_names_the_known_ones() -> None:
    with pytest.raises(
        registry.BackendUnavailable,
        match=r"^KILN_BACKEND=pbs: no such backend; the backends are "
        r"kubernetes, local, slurm$",
    ):
        registry.load("pbs")


def test_a_target_that_is_not_a_backend_is_refused() -> None:
    with pytest.raises(registry.BackendUnavailable, match=r"kiln.errors:KilnError is not a Backend"):
        registry.load("odd", {"odd": "kiln.errors:KilnError"})


def test_capabilities_are_declared_not_defaulted() -> None:
    """A backend does what it declares and nothing else: no no-op methods or flags stand in for a capability."""
    assert declared(KubernetesBackend) == {"SpecValidator", "Preemptible", "ServiceDeployer", "NotebookHost"}
    assert isinstance(object.__new__(KubernetesBackend), Preemptible | SpecValidator)
    for method in ("collect_outputs", "sync_checkpoints", "release", "sweep"):
        assert not hasattr(KubernetesBackend, method), method
    assert not hasattr(LocalBackend, "extracts_log_metrics")
