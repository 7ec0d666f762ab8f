"""Every KilnError subclass round-trips: the server's handler sends it, the SDK rebuilds the same class (issue 26:
NoReplica, PredictFailed, CsrfRefused and BackendUnavailable came back as a plain status-500 KilnError)."""

from __future__ import annotations

import importlib
import json
import pkgutil
import subprocess
import sys
from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

import kiln
from kiln import errors
from kiln.api.errors import install_error_handlers
from kiln.errors import ERRORS_BY_CODE, KilnError, error_from_body
from kiln.sdk.services import _raise_for

# Modules that are not Kiln's to import here: alembic's migration environment (runs only under alembic) and the
# files shipped into a Kubernetes pod beside each other (they import their siblings by bare name).
NOT_IMPORTABLE = ("kiln.db.migrations", "kiln.backends.kubernetes.pod", "kiln.__main__")


def _import_everything() -> None:
    for module in pkgutil.walk_packages(kiln.__path__, "kiln."):
        if not module.name.startswith(NOT_IMPORTABLE):
            importlib.import_module(module.name)


def _subclasses(cls: type[KilnError]) -> Iterator[type[KilnError]]:
    for sub in cls.__subclasses__():
        yield sub
        yield from _subclasses(sub)


_import_everything()
EVERY_ERROR = sorted({KilnError, *_subclasses(KilnError)}, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def _make(cls: type[KilnError]) -> KilnError:
    if cls.__name__ == "AuthFailure":  # its reason comes first; the message is what the client is told
        return cls("signature", "secret detail for the log", key_id="AK1", message="the signature does not match")  # type: ignore[call-arg]
    return cls(f"a {cls.__name__} happened", details={"why": cls.__name__, "retry_after": 3})


def _travels_as(cls: type[KilnError]) -> type[KilnError]:
    """The class that owns the code ``cls`` sends: itself, or (refines_code) the nearest ancestor with a code."""
    return next(c for c in cls.__mro__ if issubclass(c, KilnError) and "code" in c.__dict__)


def test_the_walk_finds_the_errors_defined_outside_kiln_errors_too():
    names = {c.__name__ for c in EVERY_ERROR}
    assert {"NoReplica", "PredictFailed", "CsrfRefused", "BackendUnavailable", "AuthFailure"} <= names


@pytest.mark.parametrize("cls", EVERY_ERROR, ids=lambda c: c.__name__)
def test_every_error_comes_back_as_its_class_through_the_api_and_the_sdk(cls):
    app = FastAPI()
    install_error_handlers(app)
    raised = _make(cls)

    @app.get("/boom")
    def boom() -> None:
        raise raised

    response = TestClient(app, raise_server_exceptions=False).get("/boom")
    assert response.status_code == cls.status
    owner = _travels_as(cls)
    assert response.json()["code"] == owner.code

    rebuilt = error_from_body(response.status_code, response.json())
    assert type(rebuilt) is owner, f"{cls.__name__} came back as {type(rebuilt).__name__}"
    assert isinstance(raised, type(rebuilt))  # an `except` of the class the SDK raises catches it on the server too
    assert (rebuilt.message, rebuilt.details, rebuilt.status) == (raised.message, raised.details, cls.status)
    with pytest.raises(owner) as caught:
        _raise_for(response)  # the SDK's own path from a response to the exception
    assert caught.value.message == raised.message


def test_only_declared_refinements_travel_as_their_parent():
    refinements = {c.__name__ for c in EVERY_ERROR if _travels_as(c) is not c}
    # A refused webhook target is an invalid input to the client (422 invalid_input) with its own class on the server.
    assert refinements == {"AuthFailure", "TargetRefused"}


def test_the_sdk_alone_knows_every_code():
    """The SDK imports no server code: the registry it sees, in a fresh interpreter, holds every code there is."""
    script = "import json, kiln.sdk.client, kiln.errors as e; print(json.dumps(sorted(e.ERRORS_BY_CODE)))"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == sorted({_travels_as(c).code for c in EVERY_ERROR})
    assert set(ERRORS_BY_CODE) == set(json.loads(out))


def test_a_subclass_that_could_not_round_trip_is_refused_where_it_is_defined():
    with pytest.raises(TypeError, match="declares no code of its own"):

        class Forgotten(errors.Conflict):
            pass

    with pytest.raises(TypeError, match=r"outside kiln\.errors"):
        type("Elsewhere", (KilnError,), {"code": "elsewhere", "__module__": "kiln.usecases.somewhere"})
    with pytest.raises(TypeError, match="already"):
        type("Twin", (KilnError,), {"code": "not_found", "__module__": "kiln.errors"})
    assert "elsewhere" not in ERRORS_BY_CODE


def test_an_unknown_code_is_the_class_its_status_means():
    error = error_from_body(409, {"code": "from_a_newer_server", "message": "m"})
    assert type(error) is errors.Conflict and error.message == "m"
    assert type(error_from_body(429, "slow down")) is errors.RateLimited
