"""kiln.domain.egress: the operator's egress rules (KILN_JOB_EGRESS), parsed and evaluated first match wins."""

from __future__ import annotations

import ipaddress

import pytest

from kiln.domain.egress import METADATA_NETWORKS, EgressRule, allowed, effective_rules, parse_rule, parse_rules


def test_parses_networks_ports_and_ranges() -> None:
    rules = parse_rules(
        [
            "deny 169.254.0.0/16",
            "allow 10.1.0.0/16:443",
            "  DENY   10.0.0.0/8 ",
            "allow 192.0.2.7",
            "allow 127.0.0.1:3128",
            "allow 10.2.0.0/16:8000-8999",
            "deny 2001:db8::/32",
            "allow [2001:db8:1::/48]:443",
            "allow 2001:db8:2::/48:80",
            "deny [fd00::1]",
            "deny ::1",
            "",
        ]
    )
    assert rules == [
        EgressRule("deny", ipaddress.ip_network("169.254.0.0/16")),
        EgressRule("allow", ipaddress.ip_network("10.1.0.0/16"), (443, 443)),
        EgressRule("deny", ipaddress.ip_network("10.0.0.0/8")),
        EgressRule("allow", ipaddress.ip_network("192.0.2.7/32")),
        EgressRule("allow", ipaddress.ip_network("127.0.0.1/32"), (3128, 3128)),
        EgressRule("allow", ipaddress.ip_network("10.2.0.0/16"), (8000, 8999)),
        EgressRule("deny", ipaddress.ip_network("2001:db8::/32")),
        EgressRule("allow", ipaddress.ip_network("2001:db8:1::/48"), (443, 443)),
        EgressRule("allow", ipaddress.ip_network("2001:db8:2::/48"), (80, 80)),
        EgressRule("deny", ipaddress.ip_network("fd00::1/128")),
        EgressRule("deny", ipaddress.ip_network("::1/128")),
    ]
    assert [str(r) for r in rules[:3]] == ["deny 169.254.0.0/16", "allow 10.1.0.0/16:443", "deny 10.0.0.0/8"]
    assert str(rules[5]) == "allow 10.2.0.0/16:8000-8999"
    assert str(rules[7]) == "allow [2001:db8:1::/48]:443"
    assert parse_rule(str(rules[7])) == rules[7]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("permit 10.0.0.0/8", "allow or deny"),
        ("deny", "expected 'allow|deny NETWORK[:PORTS]'"),
        ("deny 10.0.0.0/8 443", "expected"),
        ("deny 10.0.0.0/33", "not a network"),
        ("deny 10.1.2.3/16", "host bits"),
        ("deny example.com", "not a network"),
        ("allow 10.0.0.0/8:0", "within 1-65535"),
        ("allow 10.0.0.0/8:70000", "within 1-65535"),
        ("allow 10.0.0.0/8:9000-8000", "the first not after the last"),
        ("allow 10.0.0.0/8:https", "not a port"),
        ("allow 10.0.0.0/8:", "not a port"),
        ("allow [2001:db8::/32", "in brackets"),
        ("allow [2001:db8::/32]443", "in brackets"),
        ("allow [2001:db8::/32]:x", "not a port"),
    ],
)
def test_a_bad_rule_is_named(text: str, says: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rules(["deny 169.254.0.0/16", text])
    assert repr(text) in str(info.value) and says in str(info.value)


def test_first_match_wins_and_no_match_allows() -> None:
    rules = parse_rules(["allow 10.1.0.0/16:443", "deny 10.0.0.0/8", "allow 10.2.0.0/16"])
    assert allowed(rules, "10.1.2.3", 443)
    assert not allowed(rules, "10.1.2.3", 80)
    assert not allowed(rules, "10.1.2.3")  # ICMP: no port, the port rule does not match
    assert not allowed(rules, "10.2.0.1", 443)  # shadowed by the deny before it
    assert allowed(rules, "8.8.8.8", 53)
    assert allowed(rules, "2001:db8::1", 443)


def test_link_local_is_always_denied_unless_an_allow_names_it() -> None:
    assert not allowed([], "169.254.169.254", 80)
    assert not allowed([], "fe80::1", 80)
    assert allowed([], "169.253.0.1", 80)
    broad = parse_rules(["allow 0.0.0.0/0", "allow ::/0", "allow 169.0.0.0/8"])
    assert not allowed(broad, "169.254.169.254", 80)  # broader allows do not name it
    assert not allowed(broad, "fe80::1", 80)
    assert allowed(broad, "169.1.0.1", 80)
    named = parse_rules(["allow 169.254.169.254/32:80"])
    assert allowed(named, "169.254.169.254", 80)
    assert not allowed(named, "169.254.169.254", 443)
    assert not allowed(named, "169.254.169.253", 80)
    assert allowed(parse_rules(["allow 169.254.0.0/16"]), "169.254.1.1", 22)
    # An operator's deny before the allow still wins.
    assert not allowed(parse_rules(["deny 169.254.169.254", "allow 169.254.0.0/16"]), "169.254.169.254", 80)


def test_effective_rules_place_the_implicit_denies() -> None:
    rules = parse_rules(["allow 169.254.169.254:80", "allow 0.0.0.0/0"])
    v4, v6 = METADATA_NETWORKS
    assert effective_rules(rules) == [
        rules[0],
        EgressRule("deny", v4),
        rules[1],
        EgressRule("deny", v4),
        EgressRule("deny", v6),
    ]
    assert effective_rules([]) == [EgressRule("deny", v4), EgressRule("deny", v6)]
