"""How the local executor tells a shim to mount inputs (backends/local/shimconfig.py): the source, and the
credentials kept apart from the config."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from kiln.backends.base import InputFile, ResolvedInput
from kiln.backends.local.shimconfig import input_config, mount_config, write_secret
from kiln.errors import BackendError
from kiln.settings import Settings
from kiln.storage.store import ObjectStore

SHA = "ab" * 32


def resolved(mode: str, prefix: str = "orgs/o1/data/sha256") -> ResolvedInput:
    return ResolvedInput(
        name="mnist",
        version=3,
        path="/data/mnist",
        env="KILN_INPUT_MNIST",
        mode=mode,
        files=(InputFile("train/a.npy", 10, SHA, f"{prefix}/ab/{SHA}"),),
        blob_prefix=prefix,
    )


def test_nothing_mounted_no_config(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "store"))
    assert mount_config(store, Settings(home=tmp_path), (resolved("stage"),)) is None


def test_a_local_store_mounts_the_organisations_blob_directory(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "store"))
    settings = Settings(home=tmp_path, mount_tools="s3fs, rclone", mount_cache_bytes=123)
    mounts = mount_config(store, settings, (resolved("mount"), resolved("stage")))
    assert mounts is not None
    assert mounts.config == {
        "tools": ["s3fs", "rclone"],
        "cache_bytes": 123,
        "source": {"kind": "local", "path": str(tmp_path / "store/orgs/o1/data/sha256")},
    }
    assert mounts.secret == {}
    files = input_config(store, resolved("mount"))["files"]
    assert files == [{"path": "train/a.npy", "size": 10, "sha256": SHA}]  # found by hash in the mount


def test_an_s3_store_gives_bucket_and_prefix_and_keeps_the_keys_apart(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        storage_url="s3://bucket/team/kiln",
        storage_endpoint_url="http://minio:9000",
        storage_region="eu-west-1",
        storage_access_key_id="AKID",
        storage_secret_access_key="s3cr3t",
    )
    store = ObjectStore(settings.resolved_storage_url, **settings.storage_options)
    mounts = mount_config(store, settings, (resolved("mount"),))
    assert mounts is not None
    assert mounts.config["source"] == {
        "kind": "s3",
        "bucket": "bucket",
        "prefix": "team/kiln/orgs/o1/data/sha256",
        "endpoint": "http://minio:9000",
        "region": "eu-west-1",
    }
    assert "s3cr3t" not in json.dumps(mounts.config)
    assert mounts.secret == {"access_key_id": "AKID", "secret_access_key": "s3cr3t"}


def test_without_keys_the_tool_gets_the_aws_chain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_PROFILE", "training")
    monkeypatch.setenv("KILN_SERVER_KEY", "not-for-the-tool")
    settings = Settings(home=tmp_path, storage_url="s3://bucket")
    store = ObjectStore(settings.resolved_storage_url, **settings.storage_options)
    mounts = mount_config(store, settings, (resolved("mount"),))
    assert mounts is not None and mounts.config["source"]["prefix"] == "orgs/o1/data/sha256"
    assert mounts.secret["env"]["AWS_PROFILE"] == "training"
    assert all(key.startswith("AWS_") for key in mounts.secret["env"])


def test_inputs_of_two_organisations_cannot_share_a_mount(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "store"))
    with pytest.raises(BackendError, match="one organisation's blobs"):
        mount_config(store, Settings(home=tmp_path), (resolved("mount"), resolved("mount", "orgs/o2/data/sha256")))


def test_the_secret_file_is_private(tmp_path: Path) -> None:
    path = tmp_path / "mount-secret.json"
    path.write_text("old")
    path.chmod(0o644)
    write_secret(path, {"access_key_id": "AKID"})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"access_key_id": "AKID"}


def test_unknown_mount_tools_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown mount tools goofys: the tools are rclone and s3fs"):
        Settings(home=tmp_path, mount_tools="rclone,goofys")
    assert Settings(home=tmp_path, mount_tools="").mount_tool_list == []
