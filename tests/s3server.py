"""A real S3-protocol server for tests and benchmarks: moto's threaded server on 127.0.0.1 (a helper, not a fake
of Kiln's own code: Kiln talks to it through s3fs/boto3 exactly as to AWS or MinIO)."""

from __future__ import annotations

import os
from typing import Any

ACCESS_KEY = "kiln-test-access"
SECRET_KEY = "kiln-test-secret"
REGION = "us-east-1"


def _dummy_credentials() -> None:
    """moto and boto3 want credentials; dummy ones, so no test can ever reach a real account."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    os.environ.setdefault("AWS_DEFAULT_REGION", REGION)


class S3Server:
    """``moto.server.ThreadedMotoServer`` on a free port; ``stop()`` takes the store down (a store outage)."""

    def __init__(self) -> None:
        _dummy_credentials()
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.endpoint = ""
        self.running = False

    def start(self) -> S3Server:
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.running = True
        return self

    def stop(self) -> None:
        if self.running:
            self._server.stop()
            self.running = False

    def client(self) -> Any:
        import boto3
        from botocore.config import Config

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY,
            region_name=REGION,
            config=Config(signature_version="s3v4"),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def kiln_settings(self, bucket: str, prefix: str = "kiln") -> dict[str, str]:
        """``KilnServer(**settings)`` for a Kiln server storing into ``s3://bucket/prefix`` on this server."""
        return {
            "storage_url": f"s3://{bucket}/{prefix}",
            "storage_endpoint_url": self.endpoint,
            "storage_region": REGION,
            "storage_access_key_id": ACCESS_KEY,
            "storage_secret_access_key": SECRET_KEY,
        }

    def storage_options(self) -> dict[str, Any]:
        """fsspec options of ``kiln.storage.store.ObjectStore`` for this server."""
        return {
            "key": ACCESS_KEY,
            "secret": SECRET_KEY,
            "client_kwargs": {"endpoint_url": self.endpoint, "region_name": REGION},
        }
