"""The local executor's job network config: the nftables rules a job's namespace gets from the operator's egress
rules, the loopback ports forwarded (by pasta under isolated, by the shim under none, which runs no pasta), and
the refusal where a machine cannot give jobs a network of their own, or only network: none."""

from __future__ import annotations

from pathlib import Path

from kiln.backends.local.network import Networking, _loopback_ports, attempt_network, nft_script
from kiln.domain.egress import parse_rules
from kiln.settings import Settings


def test_the_rules_deny_the_machine_first_then_follow_the_operator_then_link_local() -> None:
    rules = parse_rules(["deny 10.0.0.0/8", "allow 127.0.0.1:3128", "allow [2001:db8::/32]:443"])
    lines = [line.strip() for line in nft_script(rules, ["192.0.2.2", "fd00::2"]).splitlines()]
    body = lines[lines.index('oif "lo" accept') :]
    assert body[:6] == [
        'oif "lo" accept',
        "ip daddr 192.0.2.2 reject with icmpx type admin-prohibited",
        "ip6 daddr fd00::2 reject with icmpx type admin-prohibited",
        "ip daddr 10.0.0.0/8 reject with icmpx type admin-prohibited",
        "ip6 daddr 2001:db8::/32 meta l4proto { tcp, udp } th dport 443 accept",
        "ip daddr 169.254.0.0/16 reject with icmpx type admin-prohibited",
    ]
    # IPv6 link-local carries neighbour discovery: only connections to it are refused.
    assert "ip6 daddr fe80::/10 meta l4proto { tcp, udp } reject with icmpx type admin-prohibited" in body
    assert not any("127.0.0.1" in line for line in body)  # a loopback allow is a forwarded port, not a rule


def test_an_allow_inside_link_local_opens_only_that_address() -> None:
    body = nft_script(parse_rules(["allow 169.254.169.254/32:80"]))
    opened = "ip daddr 169.254.169.254/32 meta l4proto { tcp, udp } th dport 80 accept"
    assert body.index(opened) < body.index("ip daddr 169.254.0.0/16 reject")


def test_the_allowed_loopback_ports_are_forwarded_with_the_api_and_none_needs_no_pasta(tmp_path: Path) -> None:
    rules = parse_rules(["allow 127.0.0.1:3128", "allow 127.0.0.1:9000-9002", "deny 127.0.0.1:5432"])
    assert _loopback_ports(rules) == [3128, 9000, 9001, 9002]
    settings = Settings(home=tmp_path, port=8123, job_egress="allow 127.0.0.1:3128")
    ok = Networking(True, "", "/usr/bin/pasta", "/usr/sbin/nft")
    isolated = attempt_network(ok, settings, "isolated", "job-1", 2)
    assert isolated is not None and isolated["forward"] == [3128, 8123]
    assert isolated["dir"] == str(tmp_path / "run" / "net" / "job-1-2")
    none = attempt_network(ok, settings, "none", "job-1", 2)
    assert none is not None and none["forward"] == [] and none["rules"] == "" and none["pasta"] is None
    # The job's 127.0.0.1:8123 is its shim's listener, forwarding to the API and nothing else (injob/apiport.py).
    assert none["api"]["port"] == 8123 and none["api"]["target"] == ["127.0.0.1", 8123]
    assert attempt_network(ok, settings, "host", "job-1", 2) is None


def test_a_machine_without_namespaces_refuses_isolated_and_none_with_the_fix() -> None:
    missing = Networking(False, "a job's network namespace cannot be made here: unshare: Operation not permitted")
    for mode in ("isolated", "none"):
        why = missing.problem(mode)
        assert why is not None and "unshare" in why and "apt-get install passt" in why
    assert missing.problem("host") is None
    assert missing.modes == ()


def test_a_machine_without_pasta_refuses_isolated_only() -> None:
    no_pasta = Networking(True, "pasta (passt) is not installed", isolated=False)
    assert no_pasta.modes == ("none",)
    assert no_pasta.problem("none") is None and no_pasta.problem("host") is None
    why = no_pasta.problem("isolated")
    assert why is not None and "pasta (passt) is not installed" in why and "network: none" in why
