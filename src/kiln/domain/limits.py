"""The platform's maxima: the largest value any request may carry, in one place.

Every number and string a client sends is bounded by one of these (pydantic ``Field(le=..., max_length=...)``
in the request models, ``Query``/``Path`` bounds in the routes), so the bounds appear in the OpenAPI schema and
an out-of-range value is a 422 naming the field, never an overflow deep in the database (SQLite and PostgreSQL
integers are 64-bit) or an allocation sized by a number the client chose. docs/storage.md lists them.

These are not settings: a server's settings (``kiln.settings``) may only lower what they govern below them.
"""

from __future__ import annotations

MAX_INT64 = 2**63 - 1
"""The largest integer a database column holds (BIGINT)."""
MAX_INT32 = 2**31 - 1
"""The largest value of an INTEGER column on PostgreSQL (quota counts, GPU counts)."""

KiB = 1024
MiB = 1024**2
GiB = 1024**3
TiB = 1024**4
PiB = 1024**5

# -- files and uploads -------------------------------------------------------------------------------------------

MAX_FILE_BYTES = 5 * TiB
"""The largest dataset file (blob): S3's largest object."""
MAX_UPLOAD_PARTS = 10_000
"""The most parts one upload session may have: S3's limit on a multipart upload."""
MIN_PART_BYTES = 5 * MiB
"""The smallest part of a multipart upload straight to S3 (all but the last)."""
MAX_PART_BYTES = 5 * GiB
"""The largest part of a multipart upload straight to S3."""
MAX_SIGNED_BODY_BYTES = 16 * MiB
"""The largest signed request body; parts sent through the API are at most this."""
MAX_MANIFEST_FILES = 1_000_000
"""The most files one dataset version may list (a server may allow fewer: KILN_DATASET_MAX_FILES). Even at
MAX_FILE_BYTES each, a version's total size stays below MAX_INT64."""
MAX_SMALL_BLOBS = 1000
"""The most blobs one POST /uploads/blobs body may carry."""

# -- names, identifiers and text ---------------------------------------------------------------------------------

MAX_ID_LENGTH = 64
"""An identifier in a URL: a job, upload, draft or access key id (ids Kiln makes are shorter)."""
MAX_NAME_LENGTH = 128
"""A display name (a job's), or an organisation or user named by id or name."""
MAX_DATASET_NAME_LENGTH = 100
"""A dataset's name."""
MAX_DATASET_REF_LENGTH = MAX_DATASET_NAME_LENGTH + 1 + 10
"""NAME@VERSION: a dataset name, '@' and a version number."""
MAX_VERSION_LENGTH = 10
"""A dataset version in a URL: 'latest' or a number up to MAX_DATASET_VERSION."""
MAX_DATASET_VERSION = 10**9
"""The highest dataset version number."""
MAX_PATH_LENGTH = 1024
"""A file's path: in a dataset, an artifact or checkpoint, a job's input mount point or TensorBoard dir."""
MAX_KEY_BYTES = 1024
"""An object store key in UTF-8 (S3's limit)."""
MAX_KEY_SEGMENT_BYTES = 255
"""One '/'-separated part of a key in UTF-8 (a file name on a local store)."""
MAX_TEXT_LENGTH = 4096
"""Short free text: a runtime's framework, version, Python path or image; a query's filter."""
MAX_DESCRIPTION_LENGTH = 256
"""An access key's description."""
MAX_QUERY_LIST_LENGTH = 4 * KiB
"""A comma-separated list in a query string (metric names)."""
MAX_REQUEST_HEAD_BYTES = 128 * KiB
"""The largest request line and headers the server reads (h11's incomplete-event limit). A request over it is
answered 400 by the HTTP layer before any route sees it, so it must hold the longest query every operation allows,
each character percent-encoded as 4 UTF-8 bytes (tests/unit/test_request_head.py checks the schema against it)."""

# -- job specs ---------------------------------------------------------------------------------------------------

MAX_COMMAND_LENGTH = 256 * KiB
"""A command (or prepare/finish command) given as one shell string."""
MAX_COMMAND_ARGS = 4096
"""Arguments of a command given as a list."""
MAX_ARG_LENGTH = 128 * KiB
"""One argument of a command list, or one environment value: Linux's MAX_ARG_STRLEN."""
MAX_ENV_VARS = 1024
"""Environment variables of a job."""
MAX_ENV_NAME_LENGTH = 256
"""An environment variable's name."""
MAX_LABELS = 64
"""Entries of a job's labels, and of its node_selector."""
MAX_LABEL_KEY_LENGTH = 63
MAX_LABEL_VALUE_LENGTH = 256
MAX_EXIT_CODES = 255
"""Exit codes in restart_on_exit_codes (each 1 to 255)."""
MAX_INPUTS = 32
"""Datasets one job reads."""
MAX_PREDICT_INPUTS = 100_000
"""Instances in one predict request (docs/serving.md)."""
MAX_METRIC_PATTERNS = 50
MAX_REGEX_LENGTH = 4000
MAX_WATCHED_METRICS = 8
"""Metrics a job's spec may name in ``metrics.watch`` (sent to the server point by point)."""
MAX_CPUS = 4096
"""CPU cores of one worker."""
MAX_GPUS = 64
"""GPUs of one worker."""
MIN_PIDS = 16
MAX_PIDS = 4_194_304
"""Processes (and threads) of one worker: at least MIN_PIDS (its sandbox's own take a few), at most Linux's
largest pid_max."""
MAX_RESOURCE_BYTES = PiB
"""Memory, or disk, of one worker (1 PiB). Times the largest gang, still far below MAX_INT64."""
MAX_QUANTITY_LENGTH = 32
"""A quantity written as text, e.g. '512Mi' or '1h30m'."""
MAX_DURATION_SECONDS = 366 * 24 * 3600
"""A job's timeout: a year."""
MAX_RESTARTS = 100

# -- tenancy -----------------------------------------------------------------------------------------------------

MAX_KEY_LIFETIME_SECONDS = 10 * 366 * 24 * 3600
"""An access key's expires_in: ten years."""
MAX_QUOTA_COUNT = MAX_INT32
"""A quota's limit on GPUs or jobs."""
MAX_QUOTA_CPUS = 1e9
MAX_QUOTA_BYTES = MAX_INT64
"""A quota's limit on memory or storage."""
MAX_SHARE_WEIGHT = 1000

# -- reads -------------------------------------------------------------------------------------------------------

MAX_PAGE_SIZE = 500
"""The most jobs one list request returns."""
MAX_AUDIT_PAGE_SIZE = 1000
MAX_LOG_READ_BYTES = 16 * MiB
"""The most log bytes one read returns."""
MAX_DOWNSAMPLE = 20_000
"""The most points per series a downsampled metrics query returns."""
MAX_COMPARE_JOBS = 50
"""Jobs one metrics comparison reads."""
MAX_METRIC_POINTS = 1_000_000
"""Points one metrics query returns over all its series (its downsample times its series could be 20 million)."""
MAX_JOB_METRIC_SERIES = 10_000_000
"""The highest ceiling of a job's metric series (``metrics.limits.series``, KILN_METRICS_MAX_SERIES)."""
MAX_JOB_METRIC_POINTS = 10**12
"""The highest ceiling of a job's metric points (``metrics.limits.points``, KILN_METRICS_MAX_POINTS)."""
MIN_METRIC_LINE_BYTES = 1 * KiB
MAX_METRIC_LINE_BYTES = 16 * MiB
"""The longest spool line any setting or spec may allow (``metrics.limits.line``): what the ingester may have to
hold of one line."""
MAX_METRIC_SPOOL_BYTES = PiB
"""The highest ceiling of the spool bytes read for one job (``metrics.limits.spool``)."""
