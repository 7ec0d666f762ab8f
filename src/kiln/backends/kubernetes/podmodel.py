"""The init container of a service replica's pod: stage the model version (and the service's code bundle).

Shipped in the service's ConfigMap beside ``podfetch.py`` (whose helpers it imports: the same directory is on
``sys.path``) and run as ``python3 /etc/kiln/podmodel.py`` in the init image, so it uses the standard library only
and never imports ``kiln``. Everything comes from the environment:

=======================  =============================================================================
KILN_ENDPOINT            the API, e.g. ``http://kiln.kiln.svc:8080``
KILN_JOB_TOKEN           a Bearer credential that may read the model (``Authorization: Bearer``), from the Secret
KILN_MODEL               the model version, pinned: ``NAME@VERSION`` (a number, never an alias)
KILN_MODEL_DIR           where its files go (an emptyDir the replica mounts read-only at ``/model``)
KILN_CODE_SHA256         the code bundle's digest (a custom predictor's module); empty: none
KILN_JOB_ID              the job whose code route serves that bundle (``GET /api/v1/jobs/{id}/code``)
KILN_WORK_DIR            where the bundle is unpacked (the replica's working directory, on its ``sys.path``)
=======================  =============================================================================

The version's manifest comes from ``GET /api/v1/models/{name}/versions/{version}`` (its ``files``: path, size,
SHA-256 each), every file from ``.../versions/{version}/files/{path}`` (``podfetch.fetch_model``, which also stages
a job's model inputs), as ``podfetch.py`` stages a dataset version: a redirect to a presigned store URL is
followed *without* the token, and every file's size and SHA-256 are checked. Any failure exits non-zero with one
line on stderr, so the pod never starts a replica on a partial model.
"""

from __future__ import annotations

import os
import sys
import tarfile

import podfetch  # shipped beside this file

fetch_model = podfetch.fetch_model


def main() -> int:
    env = os.environ
    endpoint = env.get("KILN_ENDPOINT", "").rstrip("/")
    token = env.get("KILN_JOB_TOKEN", "")
    model = env.get("KILN_MODEL", "")
    if not (endpoint and token and model):
        print("kiln-fetch: KILN_ENDPOINT, KILN_JOB_TOKEN and KILN_MODEL are needed to stage a model", file=sys.stderr)
        return 2
    name, _, version = model.partition("@")
    if not name or not version.isdigit():  # the render pins the version number: never an alias here
        print(f"kiln-fetch: KILN_MODEL={model!r}: expected NAME@VERSION with a version number", file=sys.stderr)
        return 1
    model_dir = env.get("KILN_MODEL_DIR", "/kiln/model")
    sha256 = env.get("KILN_CODE_SHA256", "")
    try:
        if sha256:
            work_dir = env.get("KILN_WORK_DIR", "/kiln/work")
            podfetch.fetch_code(endpoint, token, env.get("KILN_JOB_ID", ""), sha256, work_dir)
            print(f"kiln-fetch: code {sha256[:12]} unpacked into {work_dir}", flush=True)
        os.makedirs(model_dir, exist_ok=True)
        files, size = fetch_model(endpoint, token, model, model_dir)
        print(f"kiln-fetch: model {model} ({files} files, {size} bytes) staged", flush=True)
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, TypeError, tarfile.TarError) as exc:
        print(f"kiln-fetch: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
