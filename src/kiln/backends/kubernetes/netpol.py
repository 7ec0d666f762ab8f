"""A job's network on Kubernetes (the spec's ``network``): a ``networking.k8s.io/v1`` NetworkPolicy per attempt,
and one per model service, that give the pods the shape the local executor gives a job's network namespace.

- **Ingress** of a job's pods: only from the pods of the same attempt (a gang's members rendezvous) and from
  Kiln's server pods (:attr:`KubeConfig.server_pod_labels`, in :attr:`KubeConfig.server_namespace` or the jobs'
  own). A model service's replicas: only from the server pods (Kiln's router), on the replica port.
- **Egress**, ``none``: DNS (UDP and TCP 53 to the cluster DNS pods, :attr:`KubeConfig.dns_pod_labels` in any
  namespace), the Kiln API (the server pods) and the attempt's own pods. ``isolated``: that, and the outside world
  as ``ipBlock`` peers of ``0.0.0.0/0`` and ``::/0`` under the operator's egress rules (``KILN_JOB_EGRESS``,
  :mod:`kiln.domain.egress`), translated by :func:`world_egress`. A model service's replicas get ``isolated``.
- ``host``: no NetworkPolicy (it could not apply: a NetworkPolicy never selects ``hostNetwork`` pods); the pods
  run with ``hostNetwork: true`` (render.py), refused unless the operator allows it (the backend's validate).

**The rules as NetworkPolicy peers.** A NetworkPolicy is a union of allows with no order, the rules are first
match wins; :func:`world_egress` translates exactly: rule ``i`` (``allow``) allows what it matches less what any
``deny`` before it matches, and what no rule matches is allowed less what any ``deny`` matches. Per address family
and per stretch of ports that no rule's port range splits, that is an ``ipBlock`` (the rule's network, or
``0.0.0.0/0``/``::/0``) with the denied networks inside it as ``except``; a deny that contains the whole block drops
it. A rule with ports matches TCP and UDP to those ports only; a stretch of the allowed set that no ``ports`` list
can express (a protocol without ports, e.g. ICMP, where port rules split the set) is left out: the translation
never allows more than the rules do. Loopback rules (``allow 127.0.0.1:3128``: the local executor's forwarded
ports) mean nothing to a pod's network and are left out.

An ``ipBlock`` is meant for addresses outside the cluster: whether it matches other pods' or Services' addresses
depends on the network plugin (Calico: yes; Cilium: no, pods are matched by identity), so the pods of other jobs
are reached, or not, as the plugin decides; ``deny`` the cluster's pod and service ranges to be sure.
"""

from __future__ import annotations

import ipaddress
import itertools
from typing import Any

from kiln.backends.kubernetes.inputs import KubeConfig
from kiln.domain.egress import MAX_PORT, MIN_PORT, EgressRule, Network, effective_rules

Obj = dict[str, Any]
DNS_PORT = 53
_WORLD = (ipaddress.IPv4Network("0.0.0.0/0"), ipaddress.IPv6Network("::/0"))
_NO_PORT = (0, 0)  # the stretch of a protocol without ports (ICMP …), beside the TCP/UDP port stretches


def _server_peer(cfg: KubeConfig) -> Obj:
    peer: Obj = {"podSelector": {"matchLabels": dict(cfg.server_pod_labels)}}
    if cfg.server_namespace and cfg.server_namespace != cfg.namespace:
        peer["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": cfg.server_namespace}}
    return peer


def _dns_rule(cfg: KubeConfig) -> Obj:
    return {
        "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": dict(cfg.dns_pod_labels)}}],
        "ports": [{"protocol": p, "port": DNS_PORT} for p in ("UDP", "TCP")],
    }


def _stretches(rules: list[EgressRule]) -> list[tuple[int, int]]:
    """The port stretches no rule's port range splits, in order, then the no-port stretch."""
    cuts = {MIN_PORT, MAX_PORT + 1}
    for rule in rules:
        if rule.ports is not None:
            cuts |= {rule.ports[0], rule.ports[1] + 1}
    points = sorted(cuts)
    return [(a, b - 1) for a, b in itertools.pairwise(points)] + [_NO_PORT]


def _covers(rule: EgressRule, stretch: tuple[int, int]) -> bool:
    if rule.ports is None:
        return True
    return stretch != _NO_PORT and rule.ports[0] <= stretch[0] and stretch[1] <= rule.ports[1]


def world_egress(rules: list[EgressRule]) -> list[Obj]:
    """NetworkPolicy egress rules (``to`` ipBlocks, ``ports``) that allow what ``rules`` allow, first match wins,
    with :func:`~kiln.domain.egress.effective_rules`' link-local denies: exactly, for TCP and UDP; a protocol
    without ports only where no port rule's deny takes the address (never more than the rules allow)."""
    effective = [r for r in effective_rules(rules) if not r.network.is_loopback]
    stretches = _stretches(effective)
    ports_of: dict[tuple[Network, tuple[Network, ...]], set[tuple[int, int]] | None] = {}  # None: every port
    for family in _WORLD:
        same = [r for r in effective if r.network.version == family.version]
        # Each allow rule less the denies before it, then the default (everything) less every deny.
        terms = [(r, [d for d in same[:i] if d.action == "deny"]) for i, r in enumerate(same) if r.action == "allow"]
        terms.append((EgressRule("allow", family), [d for d in same if d.action == "deny"]))
        for rule, denies in terms:
            excepted: dict[tuple[int, int], tuple[Network, ...] | None] = {}  # stretch → except (None: all denied)
            for stretch in stretches:
                if not _covers(rule, stretch):
                    continue
                taken = [d.network for d in denies if _covers(d, stretch)]
                if any(rule.network.subnet_of(net) for net in taken):  # type: ignore[arg-type]
                    excepted[stretch] = None
                    continue
                inside = [net for net in taken if net.subnet_of(rule.network)]  # type: ignore[arg-type]
                excepted[stretch] = tuple(ipaddress.collapse_addresses(inside))  # type: ignore[type-var]
            widest: tuple[Network, ...] | None = None  # every port and protocol, less what any stretch denies
            if len(excepted) == len(stretches) and all(e is not None for e in excepted.values()):
                union = tuple(ipaddress.collapse_addresses(n for e in excepted.values() for n in e or ()))  # type: ignore[type-var]
                if rule.network not in union:
                    widest = union
                    ports_of[(rule.network, union)] = None
            for stretch, nets in excepted.items():
                if nets is None or nets == widest or stretch == _NO_PORT:
                    continue
                block = (rule.network, nets)
                if block not in ports_of or ports_of[block] is not None:
                    ports_of.setdefault(block, set()).add(stretch)  # type: ignore[union-attr]
    by_ports: dict[tuple[tuple[int, int], ...] | None, list[Obj]] = {}
    for (cidr, nets), covered in ports_of.items():
        peer: Obj = {"ipBlock": {"cidr": str(cidr), **({"except": [str(n) for n in nets]} if nets else {})}}
        key: tuple[tuple[int, int], ...] | None = None
        if covered is not None:
            ranges: list[tuple[int, int]] = []
            for first, last in sorted(covered):
                if ranges and ranges[-1][1] + 1 == first:
                    ranges[-1] = (ranges[-1][0], last)
                else:
                    ranges.append((first, last))
            key = tuple(ranges)
        if peer not in by_ports.setdefault(key, []):
            by_ports[key].append(peer)
    out: list[Obj] = []
    for key, peers in by_ports.items():
        rule_out: Obj = {"to": peers}
        if key is not None:
            rule_out["ports"] = [
                {"protocol": protocol, "port": first, **({"endPort": last} if last > first else {})}
                for first, last in key
                for protocol in ("TCP", "UDP")
            ]
        out.append(rule_out)
    return out


def job_network_policy(
    meta: Obj, selector: dict[str, str], network: str, cfg: KubeConfig, rules: list[EgressRule]
) -> Obj | None:
    """The NetworkPolicy of one attempt's pods (``selector``: labels all of them carry, and no other pod), or
    None for ``host``."""
    if network == "host":
        return None

    def own() -> Obj:
        return {"podSelector": {"matchLabels": dict(selector)}}

    egress: list[Obj] = [_dns_rule(cfg), {"to": [_server_peer(cfg)]}, {"to": [own()]}]
    if network == "isolated":
        egress += world_egress(rules)
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [own(), _server_peer(cfg)]}],
            "egress": egress,
        },
    }


def service_network_policy(
    meta: Obj, selector: dict[str, str], port: int, cfg: KubeConfig, rules: list[EgressRule]
) -> Obj:
    """The NetworkPolicy of a model service's replicas: requests from Kiln's router (the server pods) on
    ``port`` only; egress as an ``isolated`` job's, less the gang."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": dict(selector)},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [{"from": [_server_peer(cfg)], "ports": [{"protocol": "TCP", "port": port}]}],
            "egress": [_dns_rule(cfg), {"to": [_server_peer(cfg)]}, *world_egress(rules)],
        },
    }
