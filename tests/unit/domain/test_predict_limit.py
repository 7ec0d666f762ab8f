"""kiln.domain.serving.check_predict_inputs: the documented limit of a predict request (docs/serving.md: at most
100,000 instances), checked before a body is forwarded to a replica; only a body long enough to break it is
parsed."""

from __future__ import annotations

import json

import pytest

from kiln.domain import limits
from kiln.domain.serving import PredictRequest, check_predict_inputs
from kiln.errors import InvalidInput


def body(count: int) -> bytes:
    return json.dumps({"inputs": [0] * count}, separators=(",", ":")).encode()


def test_the_limit_is_the_documented_one() -> None:
    assert limits.MAX_PREDICT_INPUTS == 100_000
    assert PredictRequest.model_json_schema()["properties"]["inputs"]["maxItems"] == limits.MAX_PREDICT_INPUTS


@pytest.mark.parametrize("count", [limits.MAX_PREDICT_INPUTS + 1, 125_000])
def test_more_instances_are_refused_naming_inputs_and_the_limit(count: int) -> None:
    with pytest.raises(InvalidInput) as refused:
        check_predict_inputs(body(count))
    assert refused.value.details == {"field": "inputs", "max": 100_000, "count": count}
    assert refused.value.message.startswith(f"inputs: at most 100000 instances in one predict request, got {count}")


def test_the_limit_itself_and_what_the_replica_judges_pass() -> None:
    check_predict_inputs(body(limits.MAX_PREDICT_INPUTS))
    # The smallest body of one instance too many is longer than what is not parsed.
    assert len(body(limits.MAX_PREDICT_INPUTS + 1)) > 2 * limits.MAX_PREDICT_INPUTS
    for other in (
        b"[" + b"0," * 150_000 + b"0]",
        b"not json " * 50_000,
        json.dumps({"inputs": "x" * 300_000}).encode(),
    ):
        check_predict_inputs(other)  # not an object with a list of inputs: the replica's 422 says so
