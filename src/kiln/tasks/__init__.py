"""Background work, one file per task, and the one runner that runs them all (runner.py; leases.py for the tasks one
server at a time runs). The scheduler, the biggest task, is a package of its own (kiln.scheduler).

    presence.py         server-presence        this server's heartbeat row, the count of live servers
    metrics_ingest.py   metrics-ingest         the jobs' metric spool files into the metrics store
    log_metrics.py      log-metrics            metrics from the logs of jobs without a shim (Kubernetes pods)
    log_shipping.py     log-shipping           running jobs' logs to the store, readable through every server
    checkpoint_sync.py  checkpoint-sync        running jobs' checkpoints to the store
    studies.py          studies (leased)       every running tuning study's trials, as jobs
    serving.py          serving (leased)       every model service's replicas, as its spec and load want them
    serving_routes.py   serving-routes         this server's router follows the replicas' rows
    nonce_flush.py      nonce-flush            a single-process server's nonces, written behind
    purges.py           purge-* (leased)       rows past their retention: nonces, audit entries, idempotency keys
    backend_work.py     backend-sweep, and each piece of a backend's own background work (the local backend's
                        shim-notify and network-spares): no backend starts a thread of its own
"""
