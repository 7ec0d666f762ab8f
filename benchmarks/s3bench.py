"""What the benchmarks on an S3-compatible store share: a moto server in its own process with one ``kiln server``
storing into a bucket on it, and files of random bytes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.kilnserver import KilnServer  # noqa: E402
from tests.s3server import S3Server  # noqa: E402

MB = 1_000_000


@contextmanager
def kiln_on_s3(home: Path, bucket: str = "kiln-bench") -> Iterator[tuple[S3Server, KilnServer, str]]:
    """(moto server, Kiln server storing into ``s3://bucket/kiln`` on it, bucket); both stopped at the end. Moto
    runs as its own process, so that it does not share an interpreter lock with the clients being measured."""
    s3 = S3Server(separate_process=True).start()
    server: KilnServer | None = None
    try:
        s3.create_bucket(bucket)
        server = KilnServer(home, **s3.kiln_settings(bucket)).start()
        yield s3, server, bucket
    finally:
        if server is not None:
            server.stop()
        s3.stop()


def random_file(path: Path, size: int) -> None:
    """``size`` random bytes (nothing for a store or a hash to take a shortcut on), written 16 MiB at a time."""
    with open(path, "wb") as fh:
        left = size
        while left:
            n = min(left, 16 * 1024 * 1024)
            fh.write(os.urandom(n))
            left -= n
