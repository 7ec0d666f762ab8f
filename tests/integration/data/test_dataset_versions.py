"""A version that does not exist of a dataset that does: every place says which versions there are (submit, the
SDK and `kiln data get` / `ls` / `rm`), against a real server."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kiln.errors import InvalidInput, NotFound
from kiln.usecases.data.datasets import describe_versions
from tests.kilnserver import KilnServer

PY = sys.executable


@pytest.fixture(scope="module")
def toyset(shared_server: KilnServer, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A dataset with versions 1, 2 and 3."""
    client = shared_server.client()
    name = f"toyset-{uuid.uuid4().hex[:8]}"
    src = tmp_path_factory.mktemp("toyset")
    for n in (1, 2, 3):
        (src / "data.txt").write_text(f"version {n}\n")
        assert client.put_dataset(src, name, state_dir=src.parent / "state").version == n
    return name


def test_submit_says_the_version_does_not_exist_and_which_do(shared_server: KilnServer, toyset: str) -> None:
    client = shared_server.client()
    with pytest.raises(InvalidInput) as info:
        client.submit({"command": "true", "runtime": {"python": PY}, "inputs": [{"dataset": f"{toyset}@9"}]})
    assert info.value.message == f"inputs[0].dataset: dataset {toyset} has no version 9; it has 1, 2, 3 (latest 3)"
    assert info.value.details == {"field": "spec.inputs[0].dataset"}
    with pytest.raises(InvalidInput) as info:  # no such dataset at all: as before, with the name alone
        client.submit({"command": "true", "runtime": {"python": PY}, "inputs": [{"dataset": "no-such-set@2"}]})
    assert info.value.message.startswith("inputs[0].dataset: no dataset 'no-such-set' in organisation ")


def test_the_sdk_says_which_versions_there_are(shared_server: KilnServer, toyset: str) -> None:
    client = shared_server.client()
    with pytest.raises(NotFound) as info:
        client.dataset_manifest(f"{toyset}@9")
    assert info.value.message == f"dataset {toyset} has no version 9; it has 1, 2, 3 (latest 3)"
    assert info.value.details == {"dataset": toyset, "version": 9, "latest": 3}  # for programs
    with pytest.raises(NotFound, match=f"dataset {toyset} has no version 4; it has 1, 2, 3 "):
        client.remove_dataset(f"{toyset}@4")


def test_the_cli_says_which_versions_there_are(shared_server: KilnServer, toyset: str, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    env.update({**shared_server.credentials(), "KILN_ENDPOINT": shared_server.url, "HOME": str(tmp_path)})
    got = subprocess.run(
        [PY, "-m", "kiln", "data", "get", f"{toyset}@9", str(tmp_path / "out")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert got.returncode == 1, got
    assert f"dataset {toyset} has no version 9; it has 1, 2, 3 (latest 3)" in " ".join(got.stderr.split()), got.stderr
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


@pytest.mark.parametrize(
    ("numbers", "text"),
    [
        ([1], "1"),
        ([1, 2, 3], "1, 2, 3"),
        ([1, 2, 3, 4], "1-4"),
        ([1, 2, 3, 5, 7, 8, 9, 10], "1, 2, 3, 5, 7-10"),
        ([*range(1, 41), 42, *range(44, 100, 2)], "1-40, 42, 44, 46, 48, …, 90, 92, 94, 96, 98"),
    ],
)
def test_version_lists_for_people(numbers: list[int], text: str) -> None:
    assert describe_versions(numbers) == text
