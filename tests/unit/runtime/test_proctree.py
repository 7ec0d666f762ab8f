"""The job's process tree as the shim sees it (runtime/proctree.py): its own helpers are not the job's."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from kiln.injob.proctree import ProcessTree


class Tree(ProcessTree):
    def __init__(self, helpers: set[int]) -> None:
        self.me, self.sid, self.helpers = os.getpid(), os.getsid(0), helpers
        self.children, self.child_index, self.exit_order = [], {}, []


def children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def test_helpers_and_their_children_are_not_part_of_the_job() -> None:
    sleep = [sys.executable, "-c", "import subprocess, time; subprocess.Popen(['sleep', '30']); time.sleep(30)"]
    job = subprocess.Popen(sleep, start_new_session=True)
    helper = subprocess.Popen(sleep, start_new_session=True)  # a FUSE daemon: its own session, our child
    try:
        deadline = time.monotonic() + 10
        while not (children(job.pid) and children(helper.pid)) and time.monotonic() < deadline:
            time.sleep(0.02)
        members = set(Tree({helper.pid}).tree())
        assert {job.pid} | children(job.pid) <= members
        assert not ({helper.pid} | children(helper.pid)) & members
        assert {helper.pid} | children(helper.pid) <= set(Tree(set()).tree())  # without the exclusion they count
    finally:
        for proc in (job, helper):
            os.killpg(proc.pid, 9)
            proc.wait()
