"""The program every member of a Kiln job runs on its Slurm node (standard library only; it never imports kiln).

The job's sbatch script (``render.py``) writes the attempt's archive, a zip whose ``__main__.py`` is this file,
to ``$KILN_SLURM_SCRATCH/kiln-$SLURM_JOB_ID.pyz`` and runs ``PYTHON ARCHIVE COMMAND [ARG...]``: in the batch
step for a job of one member, or through ``srun`` (one task per node, after ``sbcast`` copied the archive to every
node) for a gang, ``$SLURM_PROCID`` being the member's place in the gang's fixed order (workers, then parameter
servers). The archive holds ``node.json`` (the members, the code bundle's digest, the inputs), Kubernetes' pod
programs unchanged (``podfetch.py``, ``podsync.py``, ``entrypoint.sh``), the metrics SDK (``kiln_sdk.py``), the
job's ``params.json`` and, for a gang, the env files of :func:`kiln.domain.distributed.member_env`, rendered with
the placeholder host ``@KILN_HOST_i@`` for member ``i``: Slurm picks the nodes only once the job starts.

What it does, in order:

1. its directory ``$KILN_SLURM_SCRATCH/kiln-$SLURM_JOB_ID/ROLE-INDEX`` with ``conf``, ``work``, ``outputs``,
   ``checkpoints``, ``metrics`` and ``run`` (what a pod's emptyDirs are), and the job's ``KILN_*`` directories
   pointing there;
2. the archive's files into ``conf``, each ``@KILN_HOST_i@`` replaced by the ``i``-th host of
   ``$SLURM_JOB_NODELIST`` (expanded here, :func:`expand_hostlist`: no ``scontrol`` needed); with one task per
   node, task ``i`` runs on node ``i``, which it checks against ``$SLURMD_NODENAME``;
3. ``podfetch.py``: the job's stored checkpoints, the code bundle, the inputs (into ``work/PATH``), all with the job
   token; a failure ends the member with the fetcher's exit code before anything runs;
4. ``podsync.py`` in the background and ``entrypoint.sh COMMAND...`` in a session of its own: prepare, the command
   (once per local process), finish; when it has ended the sync uploads the checkpoints and outputs, the entrypoint
   waits for it and exits with the command's code;
5. the entrypoint's output goes to the member's Slurm output file and, in batches, to the job's log on the server
   (:class:`LogShipper`: the server cannot read the node's files);
6. SIGTERM and SIGINT (``scancel``, the time limit, ``srun`` passing them on) go to the entrypoint, which stops
   the job's whole process tree; once it exits the sync is stopped, the member's directory removed, and the
   member exits with the entrypoint's code. SIGURG is Kiln's preemption (``scancel --signal=URG``, to the batch step
   and every other step): the notice file ``$KILN_NOTICE_FILE`` is written, then the entrypoint gets SIGTERM.
   SIGURG because Slurm delivers it to every process of a step, the job's own included, and SIGURG is the one
   signal whose default action (ignore) leaves a process that does not expect it running.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from typing import IO, Any

HOST_PLACEHOLDER = "@KILN_HOST_{}@"
SYNC_STOP_SECONDS = 30
LOG_SHIP_SECONDS = 0.3  # how often the member's new output goes to the server
LOG_BATCH = 256 * 1024  # ... or sooner, once this much waits
LOG_BACKLOG = 8 * 1024 * 1024  # what may wait while the server is unreachable
LOG_CLOSE_SECONDS = 120  # how long a member that ended tries to send its last lines
_PLACEHOLDER = re.compile(r"@KILN_HOST_(\d+)@")


def _split_top(text: str) -> list[str]:
    """``a[1-2],b`` → ``["a[1-2]", "b"]``: commas outside brackets separate the items."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _expand(item: str) -> list[str]:
    start = item.find("[")
    if start < 0:
        return [item]
    end = item.index("]", start)
    prefix, body, tails = item[:start], item[start + 1 : end], _expand(item[end + 1 :])
    out: list[str] = []
    for part in body.split(","):
        low, _, high = part.partition("-")
        numbers = [low] if not high else [f"{n:0{len(low)}d}" for n in range(int(low), int(high) + 1)]
        out.extend(prefix + number + tail for number in numbers for tail in tails)
    return out


def expand_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list (``node[01-03,7],gpu-[1-2]-ib``) as names, in its order."""
    return [host for item in _split_top(text) for host in _expand(item)]


def _say(text: str) -> None:
    print(f"kiln: {text}", file=sys.stderr, flush=True)


def reachable(hosts: list[str]) -> list[str]:
    """Each node as the gang's members can reach it: its name where that resolves, else its ``NodeAddr`` as Slurm
    knows it (``scontrol show node -o``: the address slurmctld reaches it at), else the name as it is."""
    missing = []
    for host in hosts:
        try:
            socket.getaddrinfo(host, None)
        except OSError:
            missing.append(host)
    if not missing:
        return hosts
    addresses: dict[str, str] = {}
    try:
        done = subprocess.run(
            ["scontrol", "show", "node", "-o", ",".join(missing)], capture_output=True, text=True, timeout=30
        )
        for line in done.stdout.splitlines():
            fields = dict(item.split("=", 1) for item in line.split() if "=" in item)
            if fields.get("NodeName") and fields.get("NodeAddr"):
                addresses[fields["NodeName"]] = fields["NodeAddr"]
    except (OSError, subprocess.SubprocessError) as exc:
        _say(f"cannot ask scontrol for the addresses of {', '.join(missing)}: {exc}")
    return [addresses.get(host, host) for host in hosts]


def _unpack(archive: str, conf: str, hosts: list[str]) -> None:
    """The archive's files into ``conf``, host placeholders resolved."""

    def host(match: re.Match[str]) -> str:
        index = int(match.group(1))
        if index >= len(hosts):
            raise SystemExit(f"kiln: member {index} has no node: SLURM_JOB_NODELIST lists {len(hosts)}")
        return hosts[index]

    with zipfile.ZipFile(archive) as zf:
        for name in zf.namelist():
            if name in ("__main__.py", "node.json") or name.endswith("/"):
                continue
            data = zf.read(name)
            if name.endswith(".env") or name == "hostfile":
                data = _PLACEHOLDER.sub(host, data.decode()).encode()
            target = os.path.join(conf, name)
            with open(target, "wb") as fh:
                fh.write(data)
            os.chmod(target, 0o755 if name.endswith((".sh", ".py")) else 0o644)


def main(argv: list[str]) -> int:
    env = dict(os.environ)
    archive = os.path.abspath(sys.argv[0])
    procid = int(env.get("SLURM_PROCID") or 0)
    hosts = expand_hostlist(env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or "")
    with zipfile.ZipFile(archive) as zf:
        node = json.loads(zf.read("node.json"))
    members = node["members"]
    if not 0 <= procid < len(members):
        _say(f"task {procid} is not a member of this gang of {len(members)}")
        return 2
    role, index = members[procid]
    if len(members) > 1 and procid < len(hosts) and env.get("SLURMD_NODENAME") not in (None, hosts[procid]):
        _say(f"warning: task {procid} runs on {env.get('SLURMD_NODENAME')}, not {hosts[procid]} (its address)")
    scratch = env.get("KILN_SLURM_SCRATCH") or env.get("TMPDIR") or "/tmp"
    member_dir = os.path.join(scratch, f"kiln-{env.get('SLURM_JOB_ID', 'nojob')}", f"{role}-{index}")
    dirs = {name: os.path.join(member_dir, name) for name in ("conf", "work", "outputs", "checkpoints", "run")}
    for path in dirs.values():
        os.makedirs(path, mode=0o700, exist_ok=True)
    _unpack(archive, dirs["conf"], reachable(hosts) if len(members) > 1 else hosts)
    env.update(
        {
            "KILN_ROLE": role,
            "JOB_COMPLETION_INDEX": str(index),  # the entrypoint's and the sync's member index, as in a pod
            "KILN_PROCS": str(node["procs"] if role == "worker" else 1),
            "KILN_CONF_DIR": dirs["conf"],
            "KILN_WORK_DIR": dirs["work"],
            "KILN_OUTPUT_DIR": dirs["outputs"],
            "KILN_CHECKPOINT_DIR": dirs["checkpoints"],
            "KILN_RUN_DIR": dirs["run"],
            "KILN_TENSORBOARD_DIR": os.path.join(member_dir, "metrics", "tensorboard"),
            "KILN_NOTICE_FILE": os.path.join(dirs["run"], "notice.json"),
            "KILN_PARAMS_FILE": os.path.join(dirs["conf"], "params.json"),
        }
    )
    inputs = []
    for item in node["inputs"]:
        where = os.path.join(dirs["work"], item["path"])
        env[item["env"]] = where
        inputs.append({**item["source"], "dir": where})
    fetch_env = {**env, "KILN_CODE_SHA256": node["code_sha256"], "KILN_INPUTS": json.dumps(inputs)}
    python = sys.executable or "python3"
    shipper = LogShipper(env, f"@{role}{index}" if len(members) > 1 else "")
    fetch, readers = _piped([python, os.path.join(dirs["conf"], "podfetch.py")], shipper, env=fetch_env)
    code = fetch.wait()
    for reader in readers:
        reader.join(5)
    if code != 0:
        message = f"fetching the code, inputs and checkpoints failed (exit code {code}); the command did not run"
        _say(message)
        shipper.read("E", io.BytesIO(f"kiln: {message}\n".encode()), io.BytesIO())
    else:
        code = _run(python, dirs, env, argv, shipper)
    shipper.close(LOG_CLOSE_SECONDS)
    shutil.rmtree(member_dir, ignore_errors=True)
    try:  # the job's directory, once its last member on this node is done
        os.rmdir(os.path.dirname(member_dir))
    except OSError:
        pass
    if env.get("SLURMD_NODENAME") != env.get("KILN_SLURM_BATCH_NODE"):
        try:  # the batch script removes its own copy; sbcast's copies on the other nodes go with their member
            os.unlink(archive)
        except OSError:
            pass
    return code


class LogShipper:
    """The member's output, line by line, to its Slurm output file (as it would go there anyway) and to the job's log
    on the server (``POST /api/v1/jobs/{id}/logs?stream=S``, with the job token) in batches every
    ``LOG_SHIP_SECONDS``: a Slurm node writes its files where the server cannot read them. ``S`` is ``O`` or ``E``,
    with ``@worker1``-style member tags in a gang, as the local executor tags them. A server that says the job
    has ended (409) or refuses the token ends the shipping; one that cannot be reached (restarting) is tried again
    with a growing pause, up to 5 s, the lines kept in order, and lines past ``LOG_BACKLOG`` bytes waiting are
    dropped, saying how many. At the end the member waits up to ``LOG_CLOSE_SECONDS`` for the last lines to go."""

    def __init__(self, env: dict[str, str], tag: str) -> None:
        self.url = f"{env.get('KILN_ENDPOINT', '').rstrip('/')}/api/v1/jobs/{env.get('KILN_JOB_ID', '')}/logs"
        self.token = env.get("KILN_JOB_TOKEN", "")
        self.tag = tag
        self.pending: dict[str, list[bytes]] = {"O": [], "E": []}
        self.size = 0
        self.dropped = 0
        self.closed = False
        self.give_up = False
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.done = threading.Event()
        self.sender = threading.Thread(target=self._send_loop, daemon=True)
        self.sender.start()

    def read(self, stream: str, pipe: IO[bytes], out: IO[bytes]) -> None:
        for line in iter(pipe.readline, b""):
            try:
                out.write(line)
                out.flush()
            except OSError:
                pass
            with self.lock:
                if self.size + len(line) > LOG_BACKLOG:
                    self.dropped += 1
                    continue
                self.pending[stream].append(line)
                self.size += len(line)
            if self.size >= LOG_BATCH:
                self.wake.set()
        pipe.close()

    def _send_loop(self) -> None:
        backoff = 0.0
        while True:
            self.wake.wait(max(LOG_SHIP_SECONDS, backoff))
            self.wake.clear()
            closing = self.closed
            sent = self._send()
            backoff = 0.0 if sent else min(5.0, max(0.5, backoff * 2))
            if closing and (sent or self.give_up):
                break
        self.done.set()

    def _send(self) -> bool:
        """Post what waits; False when the server could not be reached (it all waits for the next try)."""
        with self.lock:
            batches = {s: b"".join(lines) for s, lines in self.pending.items() if lines}
            dropped, self.dropped = self.dropped, 0
            for lines in self.pending.values():
                lines.clear()
            self.size = 0
        if dropped:
            note = f"kiln: {dropped} log lines were dropped: the server could not take them fast enough\n"
            batches["E"] = batches.get("E", b"") + note.encode()
        for stream, body in batches.items():
            if not self.token:
                continue
            answer = self._post(stream, body)
            if answer is None:  # unreachable: kept, in order, ahead of what came meanwhile
                with self.lock:
                    self.pending[stream].insert(0, body)
                    self.size += len(body)
                return False
            if not answer:
                self.token = ""  # the server will take no more: the job has ended or the token is refused
        return True

    def _post(self, stream: str, body: bytes) -> bool | None:
        """True: taken; False: refused for good; None: the server could not be reached."""
        query = urllib.parse.urlencode({"stream": stream + self.tag})
        request = urllib.request.Request(
            f"{self.url}?{query}",
            data=body,
            method="POST",
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "text/plain; charset=utf-8"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                response.read()
            return True
        except urllib.error.HTTPError as exc:
            if exc.code in (401, 403, 404, 409):
                _say(f"the server takes no more log lines ({exc.code}); they stay in the Slurm output file")
                return False
            return None
        except (OSError, ValueError):
            return None

    def close(self, timeout: float) -> None:
        """Send what is left, trying an unreachable server (a restarting one) for up to ``timeout`` seconds."""
        self.closed = True
        self.wake.set()
        if not self.done.wait(timeout):
            self.give_up = True
            self.wake.set()
            self.done.wait(5)


def _piped(
    argv: list[str], shipper: LogShipper, **options: Any
) -> tuple[subprocess.Popen[bytes], list[threading.Thread]]:
    """``argv`` started with its output read by ``shipper``; the process and its two readers."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, **options)
    assert proc.stdout is not None and proc.stderr is not None
    readers = [
        threading.Thread(target=shipper.read, args=("O", proc.stdout, sys.stdout.buffer), daemon=True),
        threading.Thread(target=shipper.read, args=("E", proc.stderr, sys.stderr.buffer), daemon=True),
    ]
    for reader in readers:
        reader.start()
    return proc, readers


def _run(python: str, dirs: dict[str, str], env: dict[str, str], argv: list[str], shipper: LogShipper) -> int:
    """podsync beside the entrypoint; signals passed on to the entrypoint (SIGURG: Kiln preempts the job, so
    the notice file first, then SIGTERM); its output shipped; the entrypoint's exit code."""
    sync = subprocess.Popen([python, os.path.join(dirs["conf"], "podsync.py")], env=env)
    entry, readers = _piped(
        ["/bin/sh", os.path.join(dirs["conf"], "entrypoint.sh"), *argv],
        shipper,
        env=env,
        cwd=dirs["work"],
        start_new_session=True,  # its `kill 0` reaches the job's processes, not this one nor the sync
    )

    def forward(signum: int, _frame: object) -> None:
        if signum == signal.SIGURG:
            notice = env["KILN_NOTICE_FILE"]
            body = {"reason": "Preempted", "message": "preempted: a higher-priority job needs the resources"}
            try:
                with open(notice + ".tmp", "w") as fh:
                    json.dump(body, fh)
                os.replace(notice + ".tmp", notice)
            except OSError as exc:
                _say(f"cannot write the notice file: {exc}")
            signum = signal.SIGTERM
        try:
            entry.send_signal(signum)
        except OSError:
            pass

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGURG):
        signal.signal(signum, forward)
    code = entry.wait()
    for reader in readers:  # the job's last lines (a process it left behind may hold the pipes: not for long)
        reader.join(5)
    sync.send_signal(signal.SIGTERM)
    try:
        sync.wait(timeout=SYNC_STOP_SECONDS)
    except subprocess.TimeoutExpired:
        sync.kill()
        sync.wait()
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
