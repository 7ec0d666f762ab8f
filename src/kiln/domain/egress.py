"""The operator's egress rules for jobs (``KILN_JOB_EGRESS``): parsing and first-match evaluation. Standard
library only: the local executor's user-mode network stack and the Kubernetes renderer's NetworkPolicies read the
same rules.

A rule is ``ACTION NETWORK[:PORTS]``:

- ``ACTION`` is ``allow`` or ``deny``;
- ``NETWORK`` is a CIDR (``10.0.0.0/8``, ``2001:db8::/32``) or a single address (``192.0.2.7``: a ``/32``);
  host bits must be zero (``10.1.2.3/16`` is refused: write ``10.1.0.0/16``);
- ``PORTS`` (optional) is a port (``443``) or an inclusive range (``8000-8999``), of TCP and UDP alike; an IPv6
  network with ports is written in brackets: ``[2001:db8::/32]:443``. A rule without ports matches every port
  and protocol; a rule with ports matches only TCP and UDP to those ports.

The first rule that matches a destination decides; a destination no rule matches is allowed (the local executor
also refuses the machine itself, whatever the rules). On top of the operator's rules, the link-local ranges
(:data:`METADATA_NETWORKS`: ``169.254.0.0/16``, where clouds serve instance metadata and credentials, and
``fe80::/10``) are always denied, except where an ``allow`` rule names addresses inside them: ``allow
169.254.169.254/32:80`` opens that one address, a broader ``allow 0.0.0.0/0`` does not (:func:`effective_rules`).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Action = Literal["allow", "deny"]
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

MIN_PORT, MAX_PORT = 1, 65535
METADATA_NETWORKS: tuple[Network, ...] = (
    ipaddress.IPv4Network("169.254.0.0/16"),
    ipaddress.IPv6Network("fe80::/10"),
)


@dataclass(frozen=True)
class EgressRule:
    """One rule: ``ports`` is an inclusive ``(first, last)`` range (one port: ``first == last``), or None for
    every port and protocol."""

    action: Action
    network: Network
    ports: tuple[int, int] | None = None

    def matches(self, address: Address, port: int | None = None) -> bool:
        """Whether a packet to ``address`` (TCP/UDP ``port``, or None for a protocol without ports, e.g. ICMP)
        matches this rule."""
        if address.version != self.network.version or address not in self.network:
            return False
        if self.ports is None:
            return True
        return port is not None and self.ports[0] <= port <= self.ports[1]

    def __str__(self) -> str:
        if self.ports is None:
            return f"{self.action} {self.network}"
        first, last = self.ports
        ports = str(first) if first == last else f"{first}-{last}"
        net = f"[{self.network}]" if self.network.version == 6 else str(self.network)
        return f"{self.action} {net}:{ports}"


def _ports(text: str, rule: str) -> tuple[int, int]:
    first, dash, last = text.partition("-")
    try:
        low, high = int(first), int(last if dash else first)
    except ValueError:
        raise ValueError(f"egress rule {rule!r}: ports {text!r} are not a port (443) or a range (8000-8999)") from None
    if not (MIN_PORT <= low <= high <= MAX_PORT):
        raise ValueError(
            f"egress rule {rule!r}: ports {text!r} must be within {MIN_PORT}-{MAX_PORT}, the first not after the last"
        )
    return low, high


def _network(text: str, rule: str) -> Network:
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise ValueError(f"egress rule {rule!r}: {text!r} is not a network ({exc})") from None


def parse_rule(text: str) -> EgressRule:
    """One rule from its text (see the module's docstring); ValueError naming the rule if it is not one."""
    words = text.split()
    if len(words) != 2:
        raise ValueError(f"egress rule {text!r}: expected 'allow|deny NETWORK[:PORTS]', e.g. 'deny 10.0.0.0/8'")
    action, target = words[0].lower(), words[1]
    if action not in ("allow", "deny"):
        raise ValueError(f"egress rule {text!r}: the action must be allow or deny, not {words[0]!r}")
    ports: tuple[int, int] | None = None
    if target.startswith("["):  # [IPv6 network]:PORTS (or just [IPv6 network])
        inner, bracket, rest = target[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ValueError(f"egress rule {text!r}: an IPv6 network with ports goes in brackets: [2001:db8::/32]:443")
        network = _network(inner, text)
        if rest:
            ports = _ports(rest[1:], text)
    else:
        try:
            network = ipaddress.ip_network(target, strict=True)
        except ValueError:
            head, colon, tail = target.rpartition(":")
            if not colon or (":" in head and "/" not in head):  # a bare IPv6 address: its last group is no port
                network = _network(target, text)
            else:
                network = _network(head, text)
                ports = _ports(tail, text)
    return EgressRule(action, network, ports)  # type: ignore[arg-type]


def parse_rules(rules: Iterable[str]) -> list[EgressRule]:
    """The operator's rules, in order; ValueError naming the first that is not a rule. Blank entries are
    skipped."""
    return [parse_rule(text) for text in rules if text.strip()]


def effective_rules(rules: Sequence[EgressRule]) -> list[EgressRule]:
    """``rules`` with the always-denied link-local ranges (:data:`METADATA_NETWORKS`) added: denied after every
    rule (nothing else matched) and before each ``allow`` rule broader than a range (one that contains it without
    naming addresses inside it), so only an ``allow`` inside a range opens part of it."""
    out: list[EgressRule] = []
    for rule in rules:
        if rule.action == "allow":
            for metadata in METADATA_NETWORKS:
                broader = rule.network.version == metadata.version and rule.network != metadata
                if broader and rule.network.supernet_of(metadata):  # type: ignore[arg-type]
                    out.append(EgressRule("deny", metadata))
        out.append(rule)
    out.extend(EgressRule("deny", metadata) for metadata in METADATA_NETWORKS)
    return out


def allowed(rules: Sequence[EgressRule], address: str | Address, port: int | None = None) -> bool:
    """Whether the rules let a job reach ``address`` (TCP/UDP ``port``; None: a protocol without ports): the
    first matching rule of :func:`effective_rules` decides, no match allows. The machine itself is the caller's
    to refuse."""
    target = ipaddress.ip_address(address) if isinstance(address, str) else address
    for rule in effective_rules(rules):
        if rule.matches(target, port):
            return rule.action == "allow"
    return True
