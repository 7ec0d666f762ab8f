"""What Kiln calls things on Kubernetes: object names, labels and the paths inside a job's pods.

- every object of an attempt is named from ``kiln-<job id>-a<attempt>`` (:func:`base_name`), cleaned into a
  DNS-1123 label and, when anything had to change or it is too long, suffixed with a hash of the original
  (:func:`dns_label`); label values go through :func:`label_value` the same way;
- every object carries ``app.kubernetes.io/managed-by: kiln``, ``kiln.io/job``, ``kiln.io/org``,
  ``kiln.io/attempt`` and ``kiln.io/role``; the job's own labels are put under ``label.kiln.io/``
  (:func:`user_labels`), and :func:`cleanup_selector` selects everything of a job or an attempt;
- the fixed paths of a pod (configuration, work, outputs, checkpoints, …) that the manifests mount.
"""

from __future__ import annotations

import hashlib
import re

from kiln.errors import InvalidInput

MANAGED_BY = "app.kubernetes.io/managed-by"
LABEL_JOB = "kiln.io/job"
LABEL_ORG = "kiln.io/org"
LABEL_ATTEMPT = "kiln.io/attempt"
LABEL_ROLE = "kiln.io/role"
USER_LABEL_PREFIX = "label.kiln.io/"

CONF_DIR = "/etc/kiln"
WORK_DIR = "/kiln/work"
OUTPUT_DIR = "/kiln/outputs"
CHECKPOINT_DIR = "/kiln/checkpoints"
METRICS_DIR = "/kiln/metrics"
RUN_DIR = "/kiln/run"
INPUTS_STAGING = "/kiln/inputs"
HOSTFILE = f"{CONF_DIR}/hostfile"
SSH_DIR = f"{CONF_DIR}/ssh"

MAX_BASE = 44  # "<base>-worker-255" (a pod's hostname) and "<base>-env-99" stay within 63
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_LABEL_NAME = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _digest(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def dns_label(text: str, max_len: int = 63) -> str:
    """``text`` as an RFC 1035 label (lowercase letters, digits, ``-``; starts with a letter; ``max_len``):
    unchanged when it already is one, else cleaned and suffixed with ``-`` + 8 hex digits of its SHA-256,
    so two different inputs never collide by cleaning and the same input always gives the same name."""
    if len(text) <= max_len and _DNS_LABEL.match(text):
        return text
    clean = re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", text.lower())).strip("-")
    if not clean or not clean[0].isalpha():
        clean = "k-" + clean
    clean = clean[: max_len - 9].rstrip("-")
    return f"{clean}-{_digest(text)}"


def label_value(text: str) -> str:
    """``text`` as a label value (≤ 63, alphanumerics and ``-_.``, alphanumeric at both ends): unchanged when
    valid, else cleaned, cut and suffixed with a hash of the original."""
    if len(text) <= 63 and _LABEL_VALUE.match(text):
        return text
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", text)
    clean = re.sub(r"^[^A-Za-z0-9]+", "", clean)[:54]
    clean = re.sub(r"[^A-Za-z0-9]+$", "", clean)
    return f"{clean}-{_digest(text)}" if clean else f"h-{_digest(text)}"


def user_labels(labels: dict[str, str]) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    """The job's own labels as Kubernetes labels, all under ``label.kiln.io/`` (never clashing with Kiln's
    or anyone's), and the mapping ``{original key: (label key, label value)}``. A key or value that is not a
    valid label name/value is renamed deterministically (:func:`label_value`)."""
    out: dict[str, str] = {}
    mapping: dict[str, tuple[str, str]] = {}
    for key in sorted(labels):
        name = key if len(key) <= 63 and _LABEL_NAME.match(key) else label_value(key.replace("/", "_"))
        if not _LABEL_NAME.match(name):
            name = f"h-{_digest(key)}"
        pair = (USER_LABEL_PREFIX + name, label_value(labels[key]))
        out[pair[0]] = pair[1]
        mapping[key] = pair
    return out, mapping


def base_name(job_id: str, attempt: int) -> str:
    """The name every object of the attempt starts with: ``kiln-<job id>-a<attempt>``."""
    return dns_label(f"kiln-{job_id}-a{attempt}", MAX_BASE)


def main_job_name(job_id: str, attempt: int, distributed: bool) -> str:
    """The Job that owns everything else of the attempt (the workers' Job of a gang)."""
    base = base_name(job_id, attempt)
    return f"{base}-worker" if distributed else base


def cleanup_selector(job_id: str, attempt: int | None = None) -> str:
    """A label selector of every object Kiln created for the job (or one attempt of it)."""
    parts = [f"{MANAGED_BY}=kiln", f"{LABEL_JOB}={label_value(job_id)}"]
    if attempt is not None:
        parts.append(f"{LABEL_ATTEMPT}={attempt}")
    return ",".join(parts)


def check_selector(key: str, value: str, what: str) -> None:
    prefix, _, name = key.rpartition("/")
    ok = bool(_LABEL_NAME.match(name)) and len(name) <= 63
    ok = ok and (not prefix or (len(prefix) <= 253 and bool(_DNS_SUBDOMAIN.match(prefix))))
    if not ok or not (len(value) <= 63 and _LABEL_VALUE.match(value)):
        raise InvalidInput(f"{what}: {key}={value!r} is not a valid Kubernetes label selector")
