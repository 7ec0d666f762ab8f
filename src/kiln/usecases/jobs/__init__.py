"""Jobs and their lifecycle: submit, every state change (lifecycle), a job's run row, recovery, removal, the scheduler's
inputs and placement, runtimes."""
