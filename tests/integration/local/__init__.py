"""The local executor: the shim, the sandbox, the job's network, mounts and files."""
