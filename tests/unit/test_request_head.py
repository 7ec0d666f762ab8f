"""The server's request-head limit holds the longest URL any operation allows.

h11 (uvicorn's HTTP layer) answers a request line and headers over its limit with a bare 400 "Invalid HTTP request
received." before any route sees them: a status no operation declares, and no word of which parameter was too long
(schemathesis found it: GET /metrics/compare with its job ids one over their maxLength, in non-ASCII characters).
So the limit (limits.MAX_REQUEST_HEAD_BYTES, given to uvicorn by kiln.api.serve) must be above the worst case of every
operation, where the route's own bound answers a 422 naming the parameter: every bounded parameter one over its
bound, each character percent-encoded as four UTF-8 bytes, plus the signed headers.
"""

from __future__ import annotations

from typing import Any

import pytest

from kiln.api.app import create_app
from kiln.domain import limits

SCHEMA = create_app().openapi()
ENCODED_CHAR = len("%F0%9F%98%80")  # one 4-byte UTF-8 character, percent-encoded
HEADERS = 8 * limits.KiB  # Authorization, the signing headers, Host, Content-Type, a proxy's X-Forwarded-For
DATE_TIME = 64  # an ISO 8601 time with a zone and fractions, with room to spare


def _enum_length(ref: str) -> int:
    name = ref.rsplit("/", 1)[-1]
    return max(len(str(v)) for v in SCHEMA["components"]["schemas"][name]["enum"])


def _value_length(schema: dict[str, Any]) -> int:
    """The longest value a parameter of this schema can carry and still reach the route (one over a string's bound)."""
    if "anyOf" in schema:
        return max(_value_length(s) for s in schema["anyOf"])
    if "$ref" in schema:
        return _enum_length(schema["$ref"])
    kind = schema.get("type")
    if kind == "null" or kind == "boolean":
        return 5
    if kind == "integer":
        return 21
    if kind == "number":
        return 32  # a float as Python or JavaScript writes it, with an exponent
    if kind == "string":
        if "enum" in schema:
            return max(len(v) for v in schema["enum"])
        if schema.get("format") == "date-time":
            return DATE_TIME
        assert "maxLength" in schema, f"an unbounded string parameter: {schema}"
        return schema["maxLength"] + 1
    raise AssertionError(f"a parameter of a kind this test does not size: {schema}")


def _worst_url(path: str, op: dict[str, Any]) -> int:
    size = len(path)
    for param in op.get("parameters", []):
        if param["in"] not in ("path", "query"):
            continue
        schema = param["schema"]
        items = next((s for s in schema.get("anyOf", [schema]) if s.get("type") == "array"), None)
        if items is not None:  # ?state=A&state=B...: one name=value per item
            per_item = len(param["name"]) + 2 + _value_length(items["items"]) * ENCODED_CHAR
            size += items["maxItems"] * per_item
        else:
            size += len(param["name"]) + 2 + _value_length(schema) * ENCODED_CHAR
    return size


OPERATIONS = [
    (f"{method.upper()} {path}", path, op) for path, ops in SCHEMA["paths"].items() for method, op in ops.items()
]


@pytest.mark.parametrize(("label", "path", "op"), OPERATIONS, ids=[label for label, _, _ in OPERATIONS])
def test_the_longest_request_of_an_operation_reaches_its_route(label: str, path: str, op: dict[str, Any]) -> None:
    worst = _worst_url(path, op) + HEADERS
    assert worst <= limits.MAX_REQUEST_HEAD_BYTES, (
        f"{label}: its parameters one over their bounds, percent-encoded, make a request head of {worst} bytes,"
        f" over the server's limit of {limits.MAX_REQUEST_HEAD_BYTES}: lower a bound or raise the limit"
    )
