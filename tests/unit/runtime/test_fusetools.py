"""What ``mode: mount`` needs of a machine, and the commands it runs (runtime/fusetools.py); real mounts are in
tests/integration/local/test_mount.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.injob import fusetools
from kiln.injob.stage import StageError


def tool(bin_dir: Path, name: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


@pytest.fixture
def machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine with a FUSE device and an empty PATH (the test adds tools to ``<tmp>/bin``)."""
    fuse = tmp_path / "fuse"
    fuse.write_bytes(b"")
    monkeypatch.setattr(fusetools, "FUSE_DEVICE", str(fuse))
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    return tmp_path / "bin"


def test_everything_missing_is_named(tmp_path: Path, machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fusetools, "FUSE_DEVICE", str(tmp_path / "no-fuse"))
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    why = fusetools.mount_problem("s3", ["rclone", "s3fs"])
    assert why is not None
    assert "no-fuse does not exist (no FUSE in this kernel or container)" in why
    assert "neither rclone nor s3fs is on PATH (install rclone or s3fs)" in why
    assert "neither fusermount3 nor fusermount is on PATH (install fuse3)" in why


def test_a_machine_with_a_tool_can_mount(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool(machine, "s3fs")
    assert fusetools.mount_problem("s3", ["rclone", "s3fs"]) is None
    assert fusetools.usable_tools("s3", ["rclone", "s3fs"]) == ["s3fs"]
    # s3fs mounts only S3: a local store needs rclone.
    assert fusetools.mount_problem("local", ["rclone", "s3fs"]) == "rclone is not on PATH (install rclone)"
    why = fusetools.mount_problem("local", ["s3fs"])
    assert why == "s3fs cannot mount a local store (only rclone can)"
    tool(machine, "rclone")
    assert fusetools.usable_tools("local", ["s3fs", "rclone"]) == ["rclone"]
    assert fusetools.usable_tools("s3", ["s3fs", "rclone"]) == ["s3fs", "rclone"]  # the configured order
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    assert "fusermount" in (fusetools.mount_problem("s3", ["rclone"]) or "")
    tool(machine, "fusermount3")
    assert fusetools.mount_problem("s3", ["rclone"]) is None


def test_mounting_can_be_turned_off(machine: Path) -> None:
    tool(machine, "rclone")
    assert fusetools.mount_problem("s3", []) == "mounting is turned off on this server (KILN_MOUNT_TOOLS is empty)"


def test_a_device_this_user_cannot_open(machine: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool(machine, "rclone")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: path != fusetools.FUSE_DEVICE and real_access(path, mode))
    assert (
        fusetools.mount_problem("s3", ["rclone"])
        == f"{fusetools.FUSE_DEVICE} is not readable and writable by this user"
    )


S3 = {
    "kind": "s3",
    "bucket": "data",
    "prefix": "kiln/orgs/o1/data/sha256",
    "endpoint": "http://s3:9000",
    "region": "eu",
}
KEYS = {"access_key_id": "AKID", "secret_access_key": "s3cr3t"}


def test_rclone_with_keys_gets_them_in_a_private_file_only(tmp_path: Path) -> None:
    argv, env, files = fusetools.rclone_command(S3, KEYS, "/m", str(tmp_path), None, 0)
    assert argv[:3] == ["mount", "kiln:data/kiln/orgs/o1/data/sha256", "/m"]
    assert "--read-only" in argv and argv[argv.index("--vfs-cache-mode") + 1] == "off"
    assert not any("s3cr3t" in a or "AKID" in a for a in argv) and "s3cr3t" not in str(env)
    (conf,) = files
    assert conf == str(tmp_path / "rclone.conf") and argv[argv.index("--config") + 1] == conf
    text = files[conf]
    for line in ("type = s3", "provider = Other", "access_key_id = AKID", "secret_access_key = s3cr3t"):
        assert line in text.splitlines()
    assert "endpoint = http://s3:9000" in text and "region = eu" in text and "env_auth" not in text


def test_rclone_without_keys_uses_the_aws_chain_of_the_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_CA_BUNDLE", "/etc/ssl/x.pem")  # the server's own environment never leaks through
    secret = {"env": {"AWS_PROFILE": "training", "AWS_ROLE_ARN": "arn:x", "LD_PRELOAD": "/evil.so"}}
    aws = dict(S3, endpoint=None)
    argv, env, files = fusetools.rclone_command(aws, secret, "/m", str(tmp_path), str(tmp_path / "c"), 5 * 2**30)
    text = next(iter(files.values()))
    assert "env_auth = true" in text and "provider = AWS" in text and "endpoint" not in text
    assert env["AWS_PROFILE"] == "training" and env["AWS_ROLE_ARN"] == "arn:x"
    assert "LD_PRELOAD" not in env and "AWS_CA_BUNDLE" not in env
    assert argv[argv.index("--vfs-cache-mode") + 1] == "full"
    assert argv[argv.index("--vfs-cache-max-size") + 1] == str(5 * 2**30)
    assert argv[argv.index("--cache-dir") + 1] == str(tmp_path / "c")


def test_rclone_mounts_a_local_directory_as_it_is(tmp_path: Path) -> None:
    argv, _, files = fusetools.rclone_command(
        {"kind": "local", "path": "/store/orgs/o1/data/sha256"}, {}, "/m", "/p", None, 0
    )
    assert argv[1] == "/store/orgs/o1/data/sha256" and list(files.values()) == [""]


def test_s3fs_command(tmp_path: Path) -> None:
    argv, env, files = fusetools.s3fs_command(S3, KEYS, "/m", str(tmp_path))
    assert argv[:3] == ["data:/kiln/orgs/o1/data/sha256", "/m", "-f"]
    options = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    passwd = str(tmp_path / "passwd-s3fs")
    assert {"ro", "umask=0222", f"passwd_file={passwd}", "url=http://s3:9000", "use_path_request_style"} <= set(options)
    assert "endpoint=eu" in options
    assert files == {passwd: "AKID:s3cr3t\n"} and "s3cr3t" not in " ".join(argv) + str(env)
    with pytest.raises(StageError, match="s3fs mounts only S3 stores"):
        fusetools.s3fs_command({"kind": "local", "path": "/x"}, {}, "/m", str(tmp_path))


def test_mount_points_are_read_with_their_escapes() -> None:
    assert fusetools._unescape(r"/tmp/a\040b\011c\134d") == "/tmp/a b\tc\\d"
    assert "/" in fusetools.mount_points()
    assert fusetools.is_mounted("/") and not fusetools.is_mounted("/definitely/not/mounted")
