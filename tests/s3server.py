"""A real S3-protocol server for tests and benchmarks: moto's threaded server on 127.0.0.1 (a helper, not a fake
of Kiln's own code: Kiln talks to it through s3fs/boto3 exactly as to AWS or MinIO)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
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
    """``moto.server.ThreadedMotoServer`` on a free port; ``stop()`` takes the store down (a store outage).

    ``separate_process=True`` runs moto's server as its own process instead (benchmarks: then it does not share
    the caller's interpreter lock with the clients being measured)."""

    def __init__(self, separate_process: bool = False) -> None:
        _dummy_credentials()
        self.separate_process = separate_process
        self._server: Any = None
        self._proc: subprocess.Popen[bytes] | None = None
        self.endpoint = ""
        self.running = False

    def start(self) -> S3Server:
        if self.separate_process:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = int(sock.getsockname()[1])
            env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.endpoint = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                        break
                except OSError:
                    time.sleep(0.1)
            else:
                self.stop()
                raise RuntimeError("moto server did not start")
        else:
            from moto.server import ThreadedMotoServer

            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            self._server.start()
            host, port = self._server.get_host_and_port()
            self.endpoint = f"http://{host}:{port}"
        self.running = True
        return self

    def stop(self) -> None:
        if not self.running:
            return
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
        else:
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
