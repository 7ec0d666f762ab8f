"""The OpenAPI schema's promises, checked on the schema itself (no server): every value a request may carry is
bounded, every operation declares the errors it answers with the body kiln.api.errors writes, and every link
leads to an operation and parameters that exist. tests/integration/api/test_api_schema.py holds a real server to
them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from kiln.api.app import create_app
from kiln.domain import limits

SCHEMA = create_app().openapi()
OPERATIONS = [
    (method.upper(), path, operation)
    for path, item in SCHEMA["paths"].items()
    for method, operation in item.items()
    if method in ("get", "put", "post", "delete", "patch", "head")
]
UNSIGNED = {"/healthz", "/readyz", "/metrics"}


def _resolve(schema: dict[str, Any]) -> dict[str, Any]:
    ref = schema.get("$ref")
    if ref is None:
        return schema
    name = ref.rsplit("/", 1)[-1]
    return SCHEMA["components"]["schemas"][name]  # type: ignore[no-any-return]


def unbounded(schema: dict[str, Any], where: str, seen: frozenset[str] = frozenset()) -> Iterator[str]:
    """Where a request value has no upper bound: a number without a maximum (or a minimum), a string without a
    maxLength (an enum, a const, raw bytes or a date-time are bounded otherwise), an array without maxItems, a map
    without maxProperties or a bound on its keys."""
    ref = schema.get("$ref")
    if ref is not None:
        if ref in seen:
            return
        seen = seen | {ref}
    schema = _resolve(schema)
    for keyword in ("anyOf", "oneOf", "allOf"):
        for index, branch in enumerate(schema.get(keyword, [])):
            yield from unbounded(branch, f"{where}<{index}>", seen)
    kind = schema.get("type")
    if kind in ("integer", "number"):
        if "maximum" not in schema and "exclusiveMaximum" not in schema:
            yield f"{where}: {kind} without a maximum"
        if "minimum" not in schema and "exclusiveMinimum" not in schema:
            yield f"{where}: {kind} without a minimum"
    elif kind == "string":
        bounded_otherwise = "enum" in schema or "const" in schema or schema.get("format") in ("binary", "date-time")
        if "maxLength" not in schema and not bounded_otherwise:
            yield f"{where}: string without a maxLength"
    elif kind == "array":
        if "maxItems" not in schema:
            yield f"{where}: array without maxItems"
        if "items" in schema:
            yield from unbounded(schema["items"], f"{where}[]", seen)
    elif kind == "object":
        for name, prop in schema.get("properties", {}).items():
            yield from unbounded(prop, f"{where}.{name}", seen)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            if "maxProperties" not in schema:
                yield f"{where}: map without maxProperties"
            yield from unbounded(schema.get("propertyNames", {"type": "string"}), f"{where}{{key}}", seen)
            yield from unbounded(extra, f"{where}{{value}}", seen)


def request_values(operation: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for parameter in operation.get("parameters", []):
        yield f"{parameter['in']}.{parameter['name']}", parameter["schema"]
    for media_type, content in operation.get("requestBody", {}).get("content", {}).items():
        yield f"body({media_type})", content["schema"]


@pytest.mark.parametrize(("method", "path", "operation"), OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS])
def test_every_value_a_request_carries_is_bounded(method: str, path: str, operation: dict[str, Any]) -> None:
    problems = [problem for where, schema in request_values(operation) for problem in unbounded(schema, where)]
    assert not problems, f"{method} {path}: " + "; ".join(problems)


def test_the_bounds_check_finds_what_is_unbounded() -> None:
    loose = {
        "type": "object",
        "properties": {
            "n": {"type": "integer", "minimum": 0},
            "s": {"type": "string"},
            "a": {"type": "array", "items": {"type": "string", "maxLength": 3}},
            "m": {"type": "object", "additionalProperties": {"type": "string", "maxLength": 3}},
            "ok": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 1}, {"type": "null"}]},
        },
    }
    assert sorted(unbounded(loose, "body")) == [
        "body.a: array without maxItems",
        "body.m: map without maxProperties",
        "body.m{key}: string without a maxLength",
        "body.n: integer without a maximum",
        "body.s: string without a maxLength",
    ]


def test_the_platform_maxima_appear_in_the_schema() -> None:
    components = SCHEMA["components"]["schemas"]
    assert components["UploadCreate"]["properties"]["size"]["maximum"] == limits.MAX_FILE_BYTES == 5 * 1024**4
    assert components["DatasetFileEntry"]["properties"]["size"]["maximum"] == limits.MAX_FILE_BYTES
    memory = components["Resources"]["properties"]["memory"]["anyOf"][0]
    assert memory["maximum"] == limits.MAX_RESOURCE_BYTES
    parameters = SCHEMA["paths"]["/api/v1/uploads/{upload_id}/parts/{number}"]["put"]["parameters"]
    number = next(p for p in parameters if p["name"] == "number")
    assert number["schema"]["maximum"] == limits.MAX_UPLOAD_PARTS
    limit = next(p for p in SCHEMA["paths"]["/api/v1/jobs"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"]["maximum"] == limits.MAX_PAGE_SIZE


def test_the_maxima_keep_sums_inside_a_database_integer() -> None:
    assert limits.MAX_MANIFEST_FILES * limits.MAX_FILE_BYTES < limits.MAX_INT64  # a dataset version's size
    largest_gang = 256 + 64  # DistributedSpec: workers and parameter servers
    assert limits.MAX_RESOURCE_BYTES * largest_gang < limits.MAX_INT64  # a job's memory, all members together
    assert limits.MAX_UPLOAD_PARTS * limits.MAX_PART_BYTES >= limits.MAX_FILE_BYTES  # 5 TiB fits 10,000 parts


@pytest.mark.parametrize(("method", "path", "operation"), OPERATIONS, ids=[f"{m} {p}" for m, p, _ in OPERATIONS])
def test_every_operation_declares_its_errors_with_the_error_body(
    method: str, path: str, operation: dict[str, Any]
) -> None:
    responses = operation["responses"]
    errors = {int(code): r for code, r in responses.items() if code.isdigit() and int(code) >= 400}
    if path not in UNSIGNED:
        assert {401, 413, 429} <= set(errors), f"{method} {path} answers 401, 413 and 429 before any route runs"
        assert 503 in errors, f"{method} {path} answers 503 while the database is unavailable"
        assert responses["429"]["headers"]["Retry-After"]["required"] is True
        assert responses["503"]["headers"]["Retry-After"]["required"] is True
    json_body = "application/json" in operation.get("requestBody", {}).get("content", {})
    if (operation.get("parameters") or json_body) and path not in UNSIGNED:
        assert 422 in errors, f"{method} {path} has parameters or a JSON body, so it answers 422"
    for code, response in errors.items():
        if path in ("/readyz",):
            continue
        schema = response["content"]["application/json"]["schema"]
        assert schema == {"$ref": "#/components/schemas/ErrorBody"}, f"{method} {path} {code}: {schema}"
    assert "HTTPValidationError" not in SCHEMA["components"]["schemas"]  # FastAPI's 422 body is not what is sent


def test_error_body_is_what_the_handlers_write() -> None:
    body = SCHEMA["components"]["schemas"]["ErrorBody"]
    assert body["required"] == ["code", "message"]
    assert set(body["properties"]) == {"code", "message", "details"}


def test_operation_ids_are_unique_and_every_link_leads_somewhere() -> None:
    ids = [operation["operationId"] for _, _, operation in OPERATIONS]
    assert len(ids) == len(set(ids)), sorted({i for i in ids if ids.count(i) > 1})
    by_id = {operation["operationId"]: operation for _, _, operation in OPERATIONS}
    links = 0
    for method, path, operation in OPERATIONS:
        for status, response in operation["responses"].items():
            for name, link in response.get("links", {}).items():
                links += 1
                target = by_id.get(link["operationId"])
                assert target is not None, f"{method} {path} {status} link {name}: no operation {link['operationId']}"
                declared = {p["name"] for p in target.get("parameters", [])}
                assert set(link["parameters"]) <= declared, f"{name}: {set(link['parameters']) - declared}"
                for value in link["parameters"].values():
                    assert value.startswith("$response.body#/") or value.isdigit(), value
    assert links >= 20
