"""Quota arithmetic (kiln.domain.quota) in integers: millicores and bytes add up exactly."""

from __future__ import annotations

from kiln.domain.quantities import millicores
from kiln.domain.quota import Limits, OrgUsage, blocked_by, never_fits

TENTH = millicores(0.1)


def test_a_hundred_tenth_cpu_jobs_use_exactly_a_ten_cpu_limit() -> None:
    limits = {"train": Limits(millicores=millicores(10))}
    usage = OrgUsage()
    for _ in range(99):
        assert blocked_by("acme", "train", limits, usage, 0, TENTH, None) is None
        usage.add("train", 0, TENTH, None)
    # the hundredth fits exactly (float counting had 9.99999999999998 + 0.1 and a residue either way)
    assert blocked_by("acme", "train", limits, usage, 0, TENTH, None) is None
    usage.add("train", 0, TENTH, None)
    assert blocked_by("acme", "train", limits, usage, 0, TENTH, None) == (
        "quota: cpus 10 of 10 in use (org acme, category train)"
    )


def test_quota_messages_show_cpus_as_people_write_them() -> None:
    limits = {"total": Limits(millicores=1500)}
    usage = OrgUsage()
    usage.add("serve", 0, 300, None)
    assert blocked_by("acme", "train", limits, usage, 0, 1250, None) == (
        "quota: cpus 0.3 of 1.5 in use (org acme, category total)"
    )
    assert never_fits("acme", "train", limits, 0, 1600, None) == (
        "quota: the job asks cpus 1.6 but the limit is 1.5 (org acme, category total)"
    )
    assert never_fits("acme", "train", limits, 0, 1500, None) is None
