"""Metric series: spool lines parsed (parse.py), stored as series, points and M4 chunk summaries (store.py), and
read back downsampled (downsample.py). Both ingestion paths write through the store: the metrics-ingest task
(kiln.tasks.metrics_ingest) and the HTTP route (kiln.usecases.tracking.metrics)."""
