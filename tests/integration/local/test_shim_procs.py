"""The shim on its own, on a temporary attempt dir: several processes per worker, and a stop with a reason."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from kiln.injob import shim as shim_module
from kiln.injob.logline import parse_line

SHIM = str(Path(shim_module.__file__).resolve())
PY = sys.executable


class Attempt:
    """One shim run: its config, the process, and what it left behind."""

    def __init__(self, root: Path, command: list[str], **config: Any) -> None:
        self.dir = root / "attempt"
        self.dir.mkdir()
        self.log_path = root / "job.log"
        self.config = {
            "job_id": "j-test",
            "attempt": 1,
            "work_dir": str(root / "work"),
            "code_archive": None,
            "log_path": str(self.log_path),
            "env": {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", "BASE": "base"},
            "prepare": None,
            "command": command,
            "finish": None,
            "timeout": None,
            "memory_limit": None,
            "grace": 5,
            "notify_socket": None,
            "runtime_build": None,
            **config,
        }
        (self.dir / "shim.json").write_text(json.dumps(self.config))
        # Its own session, as the executor starts it: the shim's process tree is its session.
        self.proc = subprocess.Popen([PY, "-I", "-S", SHIM, str(self.dir)], start_new_session=True)
        self.started = time.monotonic()

    def wait(self, timeout: float = 30) -> dict[str, Any]:
        assert self.proc.wait(timeout=timeout) == 0
        self.elapsed = time.monotonic() - self.started
        return json.loads((self.dir / "exit.json").read_text())  # type: ignore[no-any-return]

    def lines(self, stream: str = "O") -> list[str]:
        if not self.log_path.exists():
            return []
        parsed = [parse_line(line) for line in self.log_path.read_text().splitlines()]
        return [text for _, s, text in parsed if s == stream]

    def wait_for_output(self, count: int, prefix: str = "", timeout: float = 20) -> list[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines() if line.startswith(prefix)]
            if len(found) >= count:
                return found
            assert self.proc.poll() is None, f"the shim ended early: {self.lines('K')}"
            time.sleep(0.05)
        raise AssertionError(f"no {count} lines {prefix!r} in {timeout}s: {self.lines()}")

    def stop(self, request: dict[str, Any] | None) -> None:
        if request is not None:
            (self.dir / "stop.json").write_text(json.dumps(request))
        os.kill(self.proc.pid, signal.SIGTERM)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture
def attempts(tmp_path: Path):
    made: list[Attempt] = []

    def make(command: list[str], **config: Any) -> Attempt:
        root = tmp_path / f"a{len(made)}"
        root.mkdir()
        made.append(Attempt(root, command, **config))
        return made[-1]

    yield make
    for attempt in made:
        attempt.kill()


def py(script: str) -> list[str]:
    return [PY, "-c", script]


def ranks(n: int) -> list[dict[str, str]]:
    return [{"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n)} for r in range(n)]


def alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


# -- several processes ------------------------------------------------------------------------------------


def test_three_procs_each_print_their_rank(attempts) -> None:
    script = (
        "import os, sys\n"
        "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], os.environ['BASE'])\n"
        "print('err', os.environ['LOCAL_RANK'], file=sys.stderr)\n"
    )
    attempt = attempts(py(script), procs=ranks(3))
    result = attempt.wait()
    assert (result["exit_code"], result["reason"]) == (0, "Completed")
    assert sorted(attempt.lines("O")) == [f"[{r}] rank {r} of 3 base" for r in range(3)]
    assert sorted(attempt.lines("E")) == [f"[{r}] err {r}" for r in range(3)]
    status = json.loads((attempt.dir / "status.json").read_text())
    assert len(status["child_pids"]) == 3 and status["child_pid"] == status["child_pids"][0]


def test_prefix_falls_back_to_the_proc_index(attempts) -> None:
    attempt = attempts(py("import os; print('hi', os.environ.get('X'))"), procs=[{"X": "a"}, {"X": "b"}])
    assert attempt.wait()["reason"] == "Completed"
    assert sorted(attempt.lines()) == ["[0] hi a", "[1] hi b"]


def test_one_proc_entry_only_adds_to_the_env(attempts) -> None:
    attempt = attempts(py("import os; print(os.environ['RANK'], os.environ['BASE'])"), procs=[{"RANK": "7"}])
    assert attempt.wait()["reason"] == "Completed"
    assert attempt.lines() == ["7 base"]  # no prefix: today's single process
    assert "child_pids" not in json.loads((attempt.dir / "status.json").read_text())


def test_without_procs_output_is_unprefixed(attempts) -> None:
    attempt = attempts(py("print('plain')"))
    assert attempt.wait()["reason"] == "Completed"
    assert attempt.lines() == ["plain"]


def test_all_succeeding_is_zero_even_when_they_end_apart(attempts) -> None:
    script = "import os, time; time.sleep(0.3 * int(os.environ['RANK'])); print('done')"
    attempt = attempts(py(script), procs=ranks(3))
    result = attempt.wait()
    assert (result["exit_code"], result["reason"]) == (0, "Completed")
    assert attempt.lines() == ["[0] done", "[1] done", "[2] done"]


def test_first_failure_stops_the_others_and_is_the_exit_code(attempts) -> None:
    script = (
        "import os, sys, time\n"
        "print('pid', os.getpid(), flush=True)\n"
        "if os.environ['RANK'] == '1':\n"
        "    time.sleep(0.5); sys.exit(3)\n"
        "time.sleep(60)\n"
    )
    attempt = attempts(py(script), procs=ranks(3), grace=2)
    pids = [int(line.split()[-1]) for line in attempt.wait_for_output(3)]
    result = attempt.wait()
    assert (result["exit_code"], result["reason"]) == (3, "Error")
    assert result["message"] == "exited with 3"
    assert attempt.elapsed < 20, "the others must be stopped, not waited for"
    assert alive(pids) == []
    assert any("process [1] exited with 3; stopping the other processes" in k for k in attempt.lines("K"))


def test_first_failure_gets_sigkill_after_the_grace_when_the_others_ignore_sigterm(attempts) -> None:
    script = (
        "import os, signal, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "if os.environ['RANK'] == '0':\n"
        "    time.sleep(0.3); sys.exit(5)\n"
        "time.sleep(60)\n"
    )
    attempt = attempts(py(script), procs=ranks(2), grace=1)
    result = attempt.wait()
    assert (result["exit_code"], result["reason"]) == (5, "Error")
    assert attempt.elapsed < 15


def test_the_memory_limit_is_for_all_procs_together(attempts) -> None:
    # Each process alone stays under the limit; the two together do not.
    script = "import time\nblock = bytearray(70 * 1024 * 1024)\nprint('allocated', flush=True)\ntime.sleep(60)\n"
    attempt = attempts(py(script), procs=ranks(2), memory_limit=120 * 1024 * 1024)
    result = attempt.wait()
    assert result["reason"] == "OOMKilled"
    assert attempt.elapsed < 20


def test_cancel_stops_every_proc(attempts) -> None:
    attempt = attempts(py("import os, time; print('pid', os.getpid(), flush=True); time.sleep(60)"), procs=ranks(3))
    pids = [int(line.split()[-1]) for line in attempt.wait_for_output(3)]
    attempt.stop(None)
    result = attempt.wait()
    assert result["reason"] == "Cancelled"
    assert alive(pids) == []


# -- a stop with a reason -------------------------------------------------------------------------------------

# Saves a "checkpoint" one second after SIGTERM. The handler only sets a flag (SIGTERM may come twice: to the
# process group and to the process).
CHECKPOINTER = """
import os, signal, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
print('ready', flush=True)
while not stop:
    time.sleep(0.02)
print('checkpointing', flush=True)
time.sleep(1.0)
with open(os.path.join(os.environ['OUT'], 'saved-' + os.environ.get('RANK', 'x')), 'w') as fh:
    fh.write('saved')
print('saved', flush=True)
"""


@pytest.mark.parametrize("procs", [1, 2])
def test_stop_json_grace_and_reason_are_honoured(attempts, tmp_path: Path, procs: int) -> None:
    out = tmp_path / "out"
    out.mkdir()
    finish_marker = tmp_path / "finish-ran"
    attempt = attempts(
        py(CHECKPOINTER),
        procs=ranks(procs),
        grace=0.2,  # the configured grace would kill the checkpoint half way
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", "OUT": str(out)},
        finish=["touch", str(finish_marker)],
    )
    attempt.wait_for_output(procs, prefix="" if procs == 1 else "[")
    attempt.stop({"reason": "Preempted", "message": "a higher-priority job needs the GPUs", "grace": 10})
    result = attempt.wait()
    assert result["reason"] == "Preempted"
    assert result["message"] == "a higher-priority job needs the GPUs"
    assert result["exit_code"] == 0  # the job saved and exited on its own within the grace
    assert sorted(p.name for p in out.iterdir()) == [f"saved-{r}" for r in range(procs)]
    assert attempt.elapsed < 9, "ended when the processes did, not at the end of the grace"
    assert sum("saved" in line for line in attempt.lines()) == procs  # output during the grace is logged
    assert not finish_marker.exists(), "a stopped attempt does not run its finish_command"
    assert any("Preempted" in k and "SIGKILL after 10s" in k for k in attempt.lines("K"))


def test_without_stop_json_sigterm_is_a_cancel_with_the_configured_grace(attempts, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    attempt = attempts(
        py(CHECKPOINTER),
        grace=0.2,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", "OUT": str(out)},
    )
    attempt.wait_for_output(1)
    attempt.stop(None)
    result = attempt.wait()
    assert result["reason"] == "Cancelled"
    assert result["message"] == "signal SIGTERM; SIGKILL after 0.2 s grace"
    assert result["exit_code"] == 137  # SIGKILLed at the end of the 0.2 s grace
    assert list(out.iterdir()) == []


def test_stop_json_grace_ends_in_sigkill(attempts) -> None:
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('ready', flush=True)\n"
    script += "time.sleep(60)\n"
    attempt = attempts(py(script), grace=30)
    attempt.wait_for_output(1)
    attempt.stop({"reason": "NodeDrained", "grace": 0.5})
    result = attempt.wait()
    assert (result["reason"], result["exit_code"]) == ("NodeDrained", 137)
    assert result["message"] == "signal SIGTERM; SIGKILL after 0.5 s grace"  # no message given: the signal
    assert attempt.elapsed < 15, "the stop's grace (0.5 s) replaces the configured one (30 s)"


@pytest.mark.parametrize("content", ["not json", "[1, 2]", '{"reason": 5, "grace": "soon"}', '{"grace": -1}'])
def test_a_malformed_stop_json_falls_back_to_a_cancel(attempts, content: str) -> None:
    attempt = attempts(py("import time; print('ready', flush=True); time.sleep(60)"), grace=0.5)
    attempt.wait_for_output(1)
    (attempt.dir / "stop.json").write_text(content)
    os.kill(attempt.proc.pid, signal.SIGTERM)
    result = attempt.wait()
    assert result["reason"] == "Cancelled"


def test_a_stop_before_the_command_records_its_reason(attempts) -> None:
    attempt = attempts(
        py("print('never')"),
        prepare=[PY, "-c", "import signal, time; print('preparing', flush=True); time.sleep(60)"],
    )
    attempt.wait_for_output(1)
    attempt.stop({"reason": "Preempted", "message": "make room", "grace": 1})
    result = attempt.wait()
    assert (result["reason"], result["message"]) == ("Preempted", "make room")
    assert "never" not in attempt.lines()


# -- signals arriving inside a signal handler ------------------------------------------------------------


def test_the_stop_handler_returns_when_it_interrupts_the_stop_flags_own_lock(tmp_path: Path) -> None:
    """A Python signal handler runs in the main thread between two bytecodes, so a second SIGTERM can interrupt
    the first one's handler, or the main thread waiting on the stop flag, while its lock is held. The handler
    must not wait for that lock: it would wait forever (the cancel test saw a shim hang this way)."""
    attempt_dir = tmp_path / "attempt"
    attempt_dir.mkdir()
    (attempt_dir / "shim.json").write_text(json.dumps({"log_path": str(tmp_path / "job.log")}))
    shim = shim_module.Shim(str(attempt_dir))
    returned = threading.Event()

    def interrupted() -> None:
        with shim.stage_stop._cond:  # what the interrupted code held
            shim.on_signal(signal.SIGTERM, None)
        returned.set()

    threading.Thread(target=interrupted, daemon=True).start()
    assert returned.wait(5), "the SIGTERM handler waited for a lock its own thread holds"
    assert shim.cancelled and shim.stage_stop.is_set() and shim.stage_stop.wait(0)
