"""Integration test collection."""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each operation's test of ``schema.parametrize()`` (tests/integration/api/test_api_schema.py) its own node
    id. schemathesis 4.32 names the items ``test[METHOD /path]`` but passes the bare test name as their
    ``originalname``, from which pytest 9 builds the node id: every operation then had the same id, and
    pytest-xdist, which schedules by node id, ran one of them in place of all."""
    for item in items:
        label = getattr(item, "operation_label", None)
        node_id = getattr(item, "_id", None)
        if isinstance(label, str) and node_id is not None and node_id.params is None:
            item._id = node_id.with_params(label)  # type: ignore[attr-defined]
