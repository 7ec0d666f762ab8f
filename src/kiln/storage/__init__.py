"""Where bytes live: the fsspec-backed object store and the job log store."""
