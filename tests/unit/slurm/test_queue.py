"""What Slurm says of Kiln's jobs, read: ``squeue`` lines as Slurm 22.05 printed them (in the backend's
``SQUEUE_FORMAT``), each state mapped to where the attempt is, and ``scontrol show node -o`` lines as nodes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from kiln.backends.base import Phase
from kiln.backends.slurm.queue import FIELDS, SQUEUE_FORMAT, QueueEntry, parse_nodes, parse_squeue, status_of

# Captured from squeue --noheader --states=all --Format=SQUEUE_FORMAT on the test cluster (Slurm 22.05).
FAILED_3 = "1|kiln-x-a1|FAILED|NonZeroExitCode|node1|2026-12-03T22:24:16|2026-12-03T22:24:16|768|"
BAD_CONSTRAINTS = "3|kiln-z-a1|FAILED|BadConstraints||2026-12-03T22:24:16|2026-12-03T22:24:16|1|"
RUNNING = "2|kiln-y-a1|RUNNING|None|node1|2026-12-03T22:24:16|NONE|0|"
AT = datetime(2026, 12, 3, 22, 24, 16, tzinfo=UTC)

# Captured from scontrol show node -o on the test cluster (Slurm 22.05).
NODE1 = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=2 CPUTot=2 CPULoad=0.19 "
    "AvailableFeatures=(null) ActiveFeatures=(null) Gres=gpu:2 NodeAddr=10.77.0.11 NodeHostName=node1 "
    "Version=22.05.8 OS=Linux 6.18.44 #1 SMP PREEMPT_DYNAMIC @0  RealMemory=4000 AllocMem=0 FreeMem=23140 "
    "Sockets=2 Boards=1 State=IDLE ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A Partitions=main  "
    "BootTime=2026-12-03T22:14:59"
)
NODE2 = (
    NODE1.replace("NodeName=node1", "NodeName=node2")
    .replace("NodeHostName=node1", "NodeHostName=node2")
    .replace("CPUTot=2", "CPUTot=64")
    .replace("RealMemory=4000", "RealMemory=512000")
    .replace("Gres=gpu:2", "Gres=gpu:a100:4(S:0-1)")
    .replace("AvailableFeatures=(null)", "AvailableFeatures=ib,bigmem")
    .replace("State=IDLE", "State=DOWN+DRAIN")
    .replace("Partitions=main", "Partitions=main,gpu")
)


def _entry(
    state: str,
    reason: str = "",
    *,
    nodes: str = "node1",
    status: int | None = 0,
    start: datetime | None = AT,
    end: datetime | None = AT,
) -> QueueEntry:
    return QueueEntry("77", "kiln-job-01abc-a2", state, reason, nodes, start, end, status)


def _padded(line: str) -> str:
    """The line as squeue versions that pad their columns print it."""
    return "|".join(f"{field:<24}" if field else field for field in line.split("|"))


# -- parse_squeue -------------------------------------------------------------------------------------------


def test_the_format_asks_for_every_field_separated_by_bars() -> None:
    assert SQUEUE_FORMAT == (
        "JobID:|,Name:|,State:|,Reason:|,NodeList:|,StartTime:|,EndTime:|,exit_code:|"
    )  # the shape of the captured lines above
    assert len(FIELDS) == len(FAILED_3.split("|")) - 1


def test_real_squeue_lines_are_parsed() -> None:
    failed, bad, running = parse_squeue("\n".join([FAILED_3, BAD_CONSTRAINTS, RUNNING]) + "\n")
    assert failed == QueueEntry("1", "kiln-x-a1", "FAILED", "NonZeroExitCode", "node1", AT, AT, 768)
    assert bad == QueueEntry("3", "kiln-z-a1", "FAILED", "BadConstraints", "", AT, AT, 1)
    # "None" is no reason; "NONE" no end time.
    assert running == QueueEntry("2", "kiln-y-a1", "RUNNING", "", "node1", AT, None, 0)
    assert failed.job_attempt == ("x", 1) and running.job_attempt == ("y", 1)


def test_padded_fields_are_stripped() -> None:
    padded = "\n".join(_padded(line) for line in (FAILED_3, BAD_CONSTRAINTS, RUNNING))
    assert "1                       |kiln-x-a1" in padded  # the padding is there to strip
    assert parse_squeue(padded) == parse_squeue("\n".join([FAILED_3, BAD_CONSTRAINTS, RUNNING]))
    assert [e.slurm_id for e in parse_squeue(padded)] == ["1", "3", "2"]


def test_lines_of_another_shape_are_skipped() -> None:
    text = "\n".join(
        [
            "",
            "JOBID|NAME|STATE|REASON|NODELIST|START_TIME|END_TIME|EXIT_CODE|",  # a header
            "squeue: error: Invalid user: nobody",
            "5|kiln-a-a1|RUNNING",  # cut short
            "x5|kiln-a-a1|RUNNING|None|node1|N/A|N/A|0|",  # not a job id
            RUNNING,
        ]
    )
    assert [e.slurm_id for e in parse_squeue(text)] == ["2"]


def test_a_state_with_flags_keeps_its_name_and_unknown_values_are_none() -> None:
    (entry,) = parse_squeue("9|kiln-a-a1|CANCELLED+|None|(null)|N/A|Unknown|-|")
    assert (entry.state, entry.nodes, entry.start, entry.end, entry.exit_status) == ("CANCELLED", "", None, None, None)


def test_jobs_that_are_not_kiln_s_have_no_job_attempt() -> None:
    line = "8|{}|RUNNING|None|node1|2026-12-03T22:24:16|NONE|0|"
    names = ["bash", "kiln-", "kiln-x", "kiln-x-a", "kiln-x-ab", "kiln--a1", "xkiln-x-a1", "kiln-x-a1 extra"]
    entries = parse_squeue("\n".join(line.format(name) for name in names))
    assert [e.name for e in entries] == [*names[:-1], "kiln-x-a1 extra"]
    assert [e.job_attempt for e in entries] == [None] * len(names)


def test_job_attempt_is_the_kiln_job_id_and_the_attempt() -> None:
    assert _entry("RUNNING").job_attempt == ("job-01abc", 2)
    named = QueueEntry("1", "kiln-job-a7-a12", "RUNNING", "", "", None, None, None)
    assert named.job_attempt == ("job-a7", 12)


@pytest.mark.parametrize(("status", "code"), [(768, 3), (9, 137), (15, 143), (0, 0), (256, 1), (None, None)])
def test_exit_code_is_the_shell_s_from_the_wait_status(status: int | None, code: int | None) -> None:
    assert _entry("FAILED", status=status).exit_code == code


# -- status_of ------------------------------------------------------------------------------------------------


def test_a_pending_job_is_starting_and_says_why_it_waits() -> None:
    status = status_of(_entry("PENDING", "Resources", nodes="", status=None, start=None, end=None))
    assert status.phase is Phase.STARTING
    assert "Resources" in status.message and "77" in status.message
    assert status.exit_code is None and status.running_at is None
    assert status_of(_entry("CONFIGURING")).phase is Phase.STARTING


def test_a_running_job_is_running_since_its_start() -> None:
    (entry,) = parse_squeue(RUNNING)
    status = status_of(entry)
    assert status.phase is Phase.RUNNING
    assert status.running_at == AT
    assert "node1" in status.message
    assert status_of(_entry("COMPLETING")).phase is Phase.RUNNING


def test_a_completed_job_exited_0() -> None:
    status = status_of(_entry("COMPLETED"))
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 0, "Completed")
    assert status.running_at == AT and status.finished_at == AT


def test_a_command_that_exited_3_is_an_error_with_code_3() -> None:
    (entry,) = parse_squeue(FAILED_3)
    status = status_of(entry)
    assert (status.phase, status.exit_code, status.reason) == (Phase.EXITED, 3, "Error")
    assert "exit code 3" in status.message
    assert status.running_at == AT and status.finished_at == AT


def test_a_job_slurm_could_never_run_says_why_and_has_no_exit_code() -> None:
    (entry,) = parse_squeue(BAD_CONSTRAINTS)
    status = status_of(entry)
    assert (status.phase, status.reason) == (Phase.EXITED, "Error")
    assert "BadConstraints" in status.message
    # Its script never ran: squeue's 1 is the controller's mark, not a wait status (it is no SIGHUP: not 129).
    assert status.exit_code is None and "exit code" not in status.message
    assert status.running_at is None  # it never had a node


def test_a_command_killed_by_a_signal_keeps_the_signal_s_code() -> None:
    status = status_of(_entry("FAILED", "RaisedSignal:9(Killed)", status=9))
    assert (status.exit_code, status.reason) == (137, "Error")
    assert "RaisedSignal" in status.message


@pytest.mark.parametrize(
    ("state", "reason"), [("TIMEOUT", "Timeout"), ("DEADLINE", "Timeout"), ("OUT_OF_MEMORY", "OOMKilled")]
)
def test_slurm_s_limits_are_named(state: str, reason: str) -> None:
    status = status_of(_entry(state, status=9))
    assert (status.phase, status.reason, status.exit_code) == (Phase.EXITED, reason, 137)


@pytest.mark.parametrize("state", ["NODE_FAIL", "BOOT_FAIL"])
def test_a_failed_node_loses_the_attempt(state: str) -> None:
    status = status_of(_entry(state, status=9))
    assert (status.phase, status.reason, status.exit_code) == (Phase.LOST, "NodeLost", None)
    assert "(exit code" not in status.message


def test_kiln_s_own_stop_names_how_the_job_ended() -> None:
    stopping = ("Preempted", "job-high needs it")
    status = status_of(_entry("CANCELLED", status=15), stopping)
    assert (status.phase, status.reason, status.message) == (Phase.EXITED, "Preempted", "job-high needs it")
    assert status.exit_code == 143
    # Without Kiln's stop, a cancel is someone's scancel.
    assert status_of(_entry("CANCELLED", status=15)).reason == "Cancelled"


def test_kiln_s_stop_names_the_end_of_a_job_that_exited_0_too() -> None:
    # A job that checkpoints on the SIGTERM of Kiln's cancel or preemption and exits 0 was still stopped.
    status = status_of(_entry("COMPLETED"), ("Preempted", "job-high needs it"))
    assert (status.phase, status.reason, status.message) == (Phase.EXITED, "Preempted", "job-high needs it")
    assert status.exit_code == 0
    assert status_of(_entry("COMPLETED")).reason == "Completed"


def test_an_unknown_ended_state_is_an_error_naming_the_state() -> None:
    status = status_of(_entry("RESV_WEIRD", status=256))
    assert (status.phase, status.reason, status.exit_code) == (Phase.EXITED, "Error", 1)
    assert "RESV_WEIRD" in status.message


# -- parse_nodes ----------------------------------------------------------------------------------------------


def test_a_real_node_line_is_parsed() -> None:
    (node,) = parse_nodes(NODE1 + "\n")
    assert node.name == "node1"
    assert (node.cpus, node.memory_mb, node.gpus, node.gpu_type) == (2, 4000, 2, None)
    assert node.features == () and node.partitions == ("main",)
    assert node.state == "IDLE" and node.usable


def test_typed_gpus_features_and_a_drained_node() -> None:
    first, second = parse_nodes(f"{NODE1}\n\n{NODE2}\n")
    assert first.name == "node1" and second.name == "node2"
    assert (second.cpus, second.memory_mb, second.gpus, second.gpu_type) == (64, 512000, 4, "a100")
    assert second.features == ("ib", "bigmem")
    assert second.partitions == ("main", "gpu")
    assert second.state == "DOWN+DRAIN" and not second.usable


@pytest.mark.parametrize(
    ("state", "usable"),
    [
        ("MIXED", True),
        ("ALLOCATED", True),
        ("IDLE+CLOUD+POWERED_DOWN", True),
        ("IDLE+DRAIN", False),
        ("MIXED+DRAIN", False),
        ("DOWN", False),
        ("FUTURE", False),
        ("IDLE+NOT_RESPONDING", False),
        ("DOWN*", False),  # scontrol marks a node that does not answer with *
        ("IDLE*", False),
        ("DOWN*+DRAIN", False),
    ],
)
def test_which_node_states_are_usable(state: str, usable: bool) -> None:
    (node,) = parse_nodes(NODE1.replace("State=IDLE", f"State={state}"))
    assert node.usable is usable


def test_a_node_without_gres_has_no_gpus_and_other_lines_are_skipped() -> None:
    line = NODE1.replace("Gres=gpu:2", "Gres=(null)")
    nodes = parse_nodes(f"No nodes in the system\n{line}\n   \nPartitionName=main Nodes=node1\n")
    assert [(n.name, n.gpus, n.gpu_type) for n in nodes] == [("node1", 0, None)]
    (shard,) = parse_nodes(NODE1.replace("Gres=gpu:2", "Gres=shard:8,gpu:h100:8(S:0-1)"))
    assert (shard.gpus, shard.gpu_type) == (8, "h100")
