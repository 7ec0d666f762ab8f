"""What ``mode: mount`` needs of a machine and of its FUSE tools: whether this one can mount (:func:`mount_problem`,
:func:`probe`), the commands that mount a store with rclone or s3fs (:func:`rclone_command`, :func:`s3fs_command`),
and seeing, undoing and stopping mounts (:func:`is_mounted`, :func:`unmount`, :func:`stop_process`).

Standard library only, like ``mount.py``, which uses it (loaded as ``kiln.injob.fusetools`` in the package or
as a plain module from this file's directory when the shim runs as a script).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

if __package__:
    from kiln.injob import datacache as _datacache
else:  # run by the shim as a script: its directory is on sys.path
    import datacache as _datacache  # type: ignore[no-redef]

StageError = _datacache.StageError

FUSE_DEVICE = "/dev/fuse"
TOOLS = ("rclone", "s3fs")
UNMOUNTERS = (("fusermount3", "-u", "-z"), ("fusermount", "-u", "-z"), ("umount", "-l"))
# The AWS chain's variables, handed to the tool when the server has no explicit keys (nothing else of the
# server's environment reaches it).
AWS_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_SHARED_CREDENTIALS_FILE",
    "AWS_CONFIG_FILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
)

# -- can this machine mount? --------------------------------------------------------------------------------


def tools_for(kind: str) -> tuple[str, ...]:
    """The tools that can mount a store of this kind: rclone mounts local directories and S3, s3fs only S3."""
    return TOOLS if kind == "s3" else ("rclone",)


def usable_tools(kind: str, tools: Sequence[str]) -> list[str]:
    """The configured tools (in their order) that can mount this kind of store and are on PATH."""
    return [t for t in tools if t in tools_for(kind) and shutil.which(t)]


def mount_problem(kind: str, tools: Sequence[str]) -> str | None:
    """Why ``mode: mount`` cannot run on this machine for a store of ``kind`` ("local" or "s3"), else None.

    Names everything that is missing: the FUSE device, a tool that can mount this store, and (for a user other
    than root) fusermount to unmount it."""
    problems = []
    if not os.path.exists(FUSE_DEVICE):
        problems.append(f"{FUSE_DEVICE} does not exist (no FUSE in this kernel or container)")
    elif not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
        problems.append(f"{FUSE_DEVICE} is not readable and writable by this user")
    able = [t for t in tools if t in tools_for(kind)]
    if not tools:
        problems.append("mounting is turned off on this server (KILN_MOUNT_TOOLS is empty)")
    elif not able:
        problems.append(f"{' and '.join(tools)} cannot mount a {kind} store (only rclone can)")
    elif not any(shutil.which(t) for t in able):
        names = f"neither {' nor '.join(able)} is" if len(able) > 1 else f"{able[0]} is not"
        problems.append(f"{names} on PATH (install {' or '.join(able)})")
    if os.geteuid() != 0 and not (shutil.which("fusermount3") or shutil.which("fusermount")):
        problems.append("neither fusermount3 nor fusermount is on PATH (install fuse3)")
    return "; ".join(problems) or None


def probe(tool: str, where: str, timeout: float = 10.0) -> str | None:
    """Mount an empty local directory read-only with rclone and unmount it: None when that works, else why.

    A FUSE device can exist where mounting is still forbidden (a container without the privilege); this finds
    out at submit rather than when a job starts. Only rclone can mount a local directory, so only it probes."""
    if tool != "rclone":
        return None
    source, point = os.path.join(where, "src"), os.path.join(where, "mnt")
    os.makedirs(source, exist_ok=True)
    os.makedirs(point, exist_ok=True)
    conf = os.path.join(where, "rclone.conf")
    open(conf, "a").close()
    argv = [shutil.which(tool) or tool, "mount", source, point, "--read-only", "--config", conf]
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=tool_base_env(),
        )
    except OSError as exc:
        return f"cannot run {tool}: {exc}"
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if is_mounted(point):
                return None
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                return f"a test mount with {tool} failed: {last_lines(err) or f'exit code {proc.returncode}'}"
            time.sleep(0.05)
        return f"a test mount with {tool} did not come up within {timeout:.0f} s"
    finally:
        unmount(point)
        stop_process(proc)
        if proc.stderr:
            proc.stderr.close()
        shutil.rmtree(where, ignore_errors=True)


# -- mounts ---------------------------------------------------------------------------------------------------


def _unescape(field: str) -> str:
    """A path as /proc/self/mountinfo writes it (space, tab, newline and backslash as octal escapes)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mount_points() -> set[str]:
    """Every mount point of this process's mount namespace (read from the kernel, never by stat-ing a mount,
    which a hung FUSE daemon would block)."""
    try:
        with open("/proc/self/mountinfo") as fh:
            return {_unescape(line.split()[4]) for line in fh if len(line.split()) > 4}
    except OSError:
        return set()


def is_mounted(path: str) -> bool:
    return os.path.realpath(path) in mount_points()


def unmount(path: str) -> bool:
    """Detach the filesystem at ``path`` (lazily: a process still reading keeps its files until it closes
    them); True when nothing is mounted there any more."""
    if not is_mounted(path):
        return True
    for argv in UNMOUNTERS:
        exe = shutil.which(argv[0])
        if exe is None:
            continue
        try:
            subprocess.run([exe, *argv[1:], path], capture_output=True, timeout=30, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if not is_mounted(path):
            return True
    return not is_mounted(path)


def stop_process(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """The tool exits by itself once unmounted; SIGTERM, then SIGKILL, if it does not."""
    for step in (None, proc.terminate, proc.kill):
        if step is not None:
            try:
                step()
            except OSError:
                pass
        try:
            proc.wait(grace)
            return
        except subprocess.TimeoutExpired:
            continue


def last_lines(text: str, n: int = 3, limit: int = 600) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines[-n:])[-limit:]


def tool_base_env() -> dict[str, str]:
    """A tool's environment: PATH, HOME and the locale only (not the server's, not the job's)."""
    return {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR") if k in os.environ}


def rclone_command(source: dict, secret: dict, point: str, private: str, cache: str | None, cache_bytes: int) -> tuple:
    """(argv, env, files to write) of ``rclone mount`` for this source: a local directory or an S3 prefix."""
    conf = os.path.join(private, "rclone.conf")
    env = tool_base_env()
    if source["kind"] == "local":
        remote, text = source["path"], ""
    else:
        lines = ["[kiln]", "type = s3", f"provider = {'Other' if source.get('endpoint') else 'AWS'}"]
        if secret.get("access_key_id"):
            lines.append(f"access_key_id = {secret['access_key_id']}")
            lines.append(f"secret_access_key = {secret['secret_access_key']}")
            if secret.get("session_token"):
                lines.append(f"session_token = {secret['session_token']}")
        else:
            lines.append("env_auth = true")
            env.update({k: v for k, v in (secret.get("env") or {}).items() if k in AWS_ENV})
        if source.get("endpoint"):
            lines += [f"endpoint = {source['endpoint']}", "force_path_style = true"]
        if source.get("region"):
            lines.append(f"region = {source['region']}")
        remote, text = f"kiln:{source['bucket']}/{source['prefix']}", "\n".join(lines) + "\n"
    argv = [
        "mount",
        remote,
        point,
        "--config",
        conf,
        "--read-only",
        *(["--allow-other"] if os.geteuid() == 0 else []),  # the sandboxed job reads it as its own uid
        "--dir-perms",
        "0555",
        "--file-perms",
        "0444",
        # Blobs are immutable (named by their content): what was listed once stays true.
        "--dir-cache-time",
        "1h",
        "--attr-timeout",
        "1h",
        # A store that does not answer fails the mount (or the first look) in seconds, not minutes.
        "--low-level-retries",
        "5",
        "--contimeout",
        "10s",
        "--log-level",
        "NOTICE",
    ]
    if cache and cache_bytes > 0:
        argv += ["--vfs-cache-mode", "full", "--cache-dir", cache, "--vfs-cache-max-size", str(cache_bytes)]
    else:
        argv += ["--vfs-cache-mode", "off"]
    return argv, env, {conf: text}


def s3fs_command(source: dict, secret: dict, point: str, private: str) -> tuple:
    """(argv, env, files to write) of ``s3fs`` (in the foreground) for an S3 prefix."""
    if source["kind"] != "s3":
        raise StageError("s3fs mounts only S3 stores")
    env = tool_base_env()
    files = {}
    options = ["ro", "umask=0222"]
    if secret.get("access_key_id"):
        passwd = os.path.join(private, "passwd-s3fs")
        files[passwd] = f"{secret['access_key_id']}:{secret['secret_access_key']}\n"
        options.append(f"passwd_file={passwd}")
    else:
        env.update({k: v for k, v in (secret.get("env") or {}).items() if k in AWS_ENV})
    if source.get("endpoint"):
        options += [f"url={source['endpoint']}", "use_path_request_style"]
    if source.get("region"):
        options.append(f"endpoint={source['region']}")
    if os.geteuid() == 0:
        options.append("allow_other")  # the sandboxed job reads the mount as its own uid
    argv = [f"{source['bucket']}:/{source['prefix']}", point, "-f", "-o", "dbglevel=warn"]
    for option in options:
        argv += ["-o", option]
    return argv, env, files


def stop_pid(pid: int, start: object, grace: float = 5.0) -> None:
    """SIGTERM a tool this process did not start (another member's), then SIGKILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except OSError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if not _datacache.alive(pid, start):
                return
            time.sleep(0.05)
