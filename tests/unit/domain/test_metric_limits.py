"""``metrics.limits`` of a spec: quantities for bytes, a spec over the operator's ceiling refused naming the field
(422), a stored spec's limits resolved over the operator's defaults and capped by the ceilings."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from kiln.domain.metric_limits import MetricLimits, MetricLimitsSpec, check_ceilings, resolve
from kiln.domain.spec import JobSpec
from kiln.errors import InvalidInput
from kiln.metrics.budget import limits_from_settings
from kiln.settings import Settings

CEILINGS = MetricLimits(series=1000, points=10_000, line=4096, spool=1 << 20)


def test_a_spec_may_lower_or_raise_a_limit_up_to_the_ceiling_and_no_further() -> None:
    spec = JobSpec.model_validate({"command": "x", "metrics": {"limits": {"series": 1000, "line": "4K"}}})
    assert spec.metrics.limits is not None and spec.metrics.limits.line == 4096
    check_ceilings(spec.metrics.limits, CEILINGS)  # at the ceiling: allowed
    with pytest.raises(InvalidInput, match=r"metrics\.limits\.series: 1001 is above") as info:
        check_ceilings(MetricLimitsSpec(series=1001), CEILINGS)
    assert info.value.status == 422 and info.value.details == {"field": "spec.metrics.limits.series"}
    with pytest.raises(InvalidInput) as info:
        check_ceilings(MetricLimitsSpec(spool="2M"), CEILINGS)
    assert info.value.details == {"field": "spec.metrics.limits.spool"}


@pytest.mark.parametrize(
    "limits",
    [{"series": 0}, {"line": "10"}, {"on_limit": "keep"}, {"sample_every": 1}, {"points": True}, {"extra": 1}],
)
def test_what_is_no_limit_is_refused(limits: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate({"command": "x", "metrics": {"limits": limits}})


def test_a_stored_specs_limits_over_the_defaults_capped_by_the_ceilings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KILN_METRICS_SERIES_DEFAULT", "50")
    monkeypatch.setenv("KILN_METRICS_MAX_LINE", "8K")
    defaults, ceilings = limits_from_settings(Settings())
    assert (defaults.series, ceilings.line) == (50, 8192)
    stored = {"points": 99, "line": 1 << 20, "on_limit": "sample"}
    resolved = resolve(stored, defaults, ceilings)
    assert (resolved.series, resolved.points, resolved.line, resolved.on_limit) == (50, 99, 8192, "sample")
    assert resolve(None, defaults, ceilings) == defaults.capped(ceilings)  # a default over a ceiling: capped
