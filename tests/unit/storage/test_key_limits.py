"""Store keys a client names (artifact and checkpoint paths) fit every store: a part of at most 255 bytes (a file
name on a local store) and at most 1024 bytes in all (S3), else 400 naming the limit, never the store's own error
(a 503: the store is not unavailable, the name is wrong)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kiln.domain import limits
from kiln.errors import BadRequest
from kiln.storage.store import ObjectStore, safe_key

ZALGO = "Ṱ̺̺̕o͞ ̷i̲̬͇̪͙n̝̗͕v̟̜̘̦͟o̶"  # a few characters, many bytes each


def test_a_part_over_255_bytes_is_refused_whatever_its_length_in_characters() -> None:
    name = ZALGO * 10
    assert len(name) < limits.MAX_PATH_LENGTH and len(name.encode()) > limits.MAX_KEY_SEGMENT_BYTES
    with pytest.raises(BadRequest, match="at most 255 bytes"):
        safe_key("outputs", name)
    assert safe_key("outputs", "é" * 127) == "outputs/" + "é" * 127  # 254 bytes


def test_a_key_over_1024_bytes_is_refused() -> None:
    parts = ["p" * 200] * 5 + ["q" * 30]
    with pytest.raises(BadRequest, match="at most 1024 bytes"):
        safe_key(*parts)
    assert len(safe_key(*parts[:5])) == 1004


def test_writing_such_a_key_is_a_400_before_the_store_is_touched(tmp_path: Path) -> None:
    store = ObjectStore(str(tmp_path / "store"))
    local = tmp_path / "artifact"
    local.write_bytes(b"x")
    with pytest.raises(BadRequest):
        store.put_file(local, f"orgs/o/jobs/j/outputs/{ZALGO * 10}")
    assert not store.exists("orgs/o/jobs/j/outputs/x")
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []
