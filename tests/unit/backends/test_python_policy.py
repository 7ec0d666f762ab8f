"""Which interpreters ``runtime.python`` may name (backends/local/python_policy.py), and what the sandbox then
shows: decided on paths made here, no server and no job."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.backends.local import python_policy, sandbox
from kiln.backends.local.python_policy import PythonPolicy
from kiln.errors import RuntimeUnavailable
from kiln.settings import Settings

BASE = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
BASE_PREFIX = os.path.dirname(os.path.dirname(BASE))


def _policy(tmp_path: Path, *roots: Path) -> PythonPolicy:
    settings = Settings(home=tmp_path / "home", allowed_python_roots=[*roots, Path(BASE_PREFIX)])
    return PythonPolicy.from_settings(settings, str(tmp_path / "store"))


def _refusal(policy: PythonPolicy, name: str) -> str:
    with pytest.raises(RuntimeUnavailable) as caught:
        policy.resolve(name, [])
    assert caught.value.details == {"field": "spec.runtime.python"}
    return caught.value.message


def test_a_path_not_allowed_is_refused_before_the_machine_is_looked_at(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = _policy(tmp_path, tmp_path / "allowed")

    def looked(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"the file system was looked at: {args}")

    for name in ("realpath", "exists", "isfile", "isdir", "islink", "lexists"):
        monkeypatch.setattr(python_policy.os.path, name, looked)
    monkeypatch.setattr(python_policy.os, "stat", looked)
    monkeypatch.setattr(python_policy.os, "access", looked)
    words = {
        name: _refusal(policy, name).replace(name, "X")
        for name in (
            "/root/.bashrc",
            "/root/.nope",
            str(tmp_path / "home" / "jobs" / "j" / "attempts"),
            str(tmp_path / "allowed" / ".." / "home" / "server.key"),
            str(tmp_path / "home"),
            str(tmp_path / "store" / "x"),
            "/var/log",
            "bin/python3",
        )
    }
    assert len(set(words.values())) == 1, words
    message = next(iter(words.values()))
    assert message.startswith("runtime.python: X is not allowed on this server; name an interpreter under")
    assert f"/usr, {tmp_path / 'allowed'}" in message and "KILN_ALLOWED_PYTHON_ROOTS" in message


def test_what_a_link_or_its_venv_leads_to_must_be_allowed_too(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (tmp_path / "home" / "jobs" / "j").mkdir(parents=True)
    (allowed / "to-job").symlink_to(tmp_path / "home" / "jobs" / "j")
    (allowed / "to-usr").symlink_to("/usr/bin")
    policy = _policy(tmp_path, allowed)
    _refusal(policy, str(allowed / "to-job" / "python3"))
    _refusal(policy, str(allowed / "to-job"))
    assert policy.resolve(str(allowed / "to-usr" / "true"), []).roots == ()  # /usr: in every sandbox anyway
    # A venv made from an interpreter the operator does not allow is refused, saying so.
    venv = allowed / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(BASE)
    (venv / "pyvenv.cfg").write_text(f"home = {tmp_path / 'elsewhere' / 'bin'}\n")
    with pytest.raises(RuntimeUnavailable, match=r"is a virtualenv made from .*elsewhere/bin, which is not allowed"):
        policy.resolve(str(venv / "bin" / "python"), [])
    (allowed / "missing").mkdir()
    with pytest.raises(RuntimeUnavailable, match="no such executable"):
        policy.resolve(str(allowed / "missing" / "python3"), [])


def test_an_interpreter_right_in_a_root_shows_that_root_not_its_parent(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "python3").symlink_to(BASE)
    found = _policy(tmp_path, allowed).resolve(str(allowed / "python3"), [])
    assert found.python == str(allowed / "python3") and found.bin_dir == str(allowed)
    assert str(tmp_path) not in found.roots
    assert str(allowed) in found.roots or str(allowed).startswith("/usr/")
    assert BASE_PREFIX in found.roots or BASE_PREFIX.startswith("/usr")
    # A root the operator listed that holds the server's state is never shown whole.
    wide = PythonPolicy.from_settings(
        Settings(home=allowed / "home", allowed_python_roots=[allowed, Path(BASE_PREFIX)])
    )
    with pytest.raises(RuntimeUnavailable, match="holds the server's own files"):
        wide.resolve(str(allowed / "python3"), [])


def test_a_venv_in_a_root_shows_the_venv_and_its_base(tmp_path: Path) -> None:
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    subprocess.run([BASE, "-m", "venv", "--without-pip", str(allowed / "env")], check=True, timeout=60)
    found = _policy(tmp_path, allowed).resolve(str(allowed / "env" / "bin" / "python"), [])
    assert found.bin_dir == str(allowed / "env" / "bin")
    assert set(found.roots) <= {str(allowed / "env"), BASE_PREFIX}
    assert str(allowed / "env") in found.roots


def test_a_catalog_runtime_may_be_named_though_it_lies_in_the_servers_home(tmp_path: Path) -> None:
    venv = tmp_path / "home" / "runtimes" / "python-3"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(BASE)
    (venv / "pyvenv.cfg").write_text(f"home = {os.path.dirname(BASE)}\n")
    policy = PythonPolicy.from_settings(Settings(home=tmp_path / "home"))
    found = policy.resolve(str(venv / "bin" / "python"), [venv])
    assert str(venv) in found.roots
    _refusal(policy, str(venv / "bin" / "python"))  # not when it is not the catalog's
    _refusal(policy, str(tmp_path / "home" / "runtimes" / "other" / "bin" / "python"))


def test_a_system_directory_holding_the_servers_home_is_shown_without_it(tmp_path: Path) -> None:
    top = tmp_path / "opt"
    (top / "kiln" / "home" / "jobs").mkdir(parents=True)
    (top / "kiln" / "tool").mkdir()
    (top / "conda").mkdir()
    (top / "link").symlink_to("conda")
    symlinks: dict[str, str] = {}
    shown = sandbox._showing_all_but(str(top), (str(top / "kiln" / "home"),), symlinks)
    assert shown == [str(top / "conda"), str(top / "kiln" / "tool")]
    assert symlinks == {str(top / "link"): "conda"}
    assert sandbox._showing_all_but(str(top), (), {}) == [str(top)]
