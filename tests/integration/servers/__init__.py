"""Several servers, leases, background tasks, crashes and recovery, backups."""
