"""Jobs: creation, inputs, paging, the lifecycle, scheduling and placement, checkpoints, runtimes."""
