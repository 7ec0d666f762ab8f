"""A job's network on Kubernetes (netpol.py): the NetworkPolicy of an attempt (isolated, none), none for host
(hostNetwork pods), a model service's; the operator's egress rules (KILN_JOB_EGRESS) as ipBlocks that allow
exactly what the rules allow, first match wins; strict validation against the official schemas."""

from __future__ import annotations

import ipaddress
import random
from pathlib import Path
from typing import Any

import pytest

from kiln.backends.kubernetes.inputs import KubeConfig, RenderInput
from kiln.backends.kubernetes.names import MANAGED_BY
from kiln.backends.kubernetes.netpol import world_egress
from kiln.backends.kubernetes.render import LABEL_ATTEMPT, LABEL_JOB, render
from kiln.backends.kubernetes.serving import REPLICA_PORT, render_service
from kiln.backends.kubernetes.settings import job_network, kube_config
from kiln.domain.egress import EgressRule, allowed, parse_rules
from kiln.domain.serving import ServiceSpec
from kiln.domain.spec import JobSpec
from kiln.errors import InvalidInput
from kiln.settings import KubernetesSettings, Settings
from tests.unit.kubernetes.conftest import VERSIONS, validate_strict

JOB = "job-01jd5y3c2k7q4m9x2a"
ORG = "org-01jd5y3c2k7q4m9x2b"
SERVER = {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "kiln", "app.kubernetes.io/component": "server"}}}
DNS = {
    "to": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}
RULES = [
    "deny 169.254.0.0/16",
    "allow 10.1.0.0/16:443",
    "deny 10.0.0.0/8",
    "deny 172.16.0.0/12",
    "allow 192.168.0.0/16:8000-8999",
    "deny 192.168.0.0/16",
    "deny 2001:db8::/32",
    "allow 127.0.0.1:3128",
]


def job_spec(**fields: Any) -> JobSpec:
    return JobSpec.model_validate({"command": "python train.py", "runtime": {"image": "ghcr.io/acme/t:1"}, **fields})


def objects_of(spec: JobSpec, cfg: KubeConfig | None = None, attempt: int = 1) -> list[dict[str, Any]]:
    return render(RenderInput(JOB, ORG, attempt, spec, token="tok"), cfg or KubeConfig())


def policy_of(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (policy,) = [o for o in objects if o["kind"] == "NetworkPolicy"]
    return policy


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return selector["matchLabels"].items() <= labels.items()


def pod_labels(objects: list[dict[str, Any]]) -> list[dict[str, str]]:
    return [o["spec"]["template"]["metadata"]["labels"] for o in objects if o["kind"] in ("Job", "Deployment")]


# -- jobs --------------------------------------------------------------------------------------------------------


def test_isolated_job_is_reached_only_by_its_gang_and_kiln_and_reaches_dns_kiln_gang_and_the_world() -> None:
    spec = job_spec(distributed={"framework": "tensorflow", "workers": 2, "ps": 1})  # two Jobs: workers and ps
    objects = objects_of(spec, KubeConfig(job_egress=RULES))
    kinds = [o["kind"] for o in objects]
    assert kinds.index("NetworkPolicy") < kinds.index("Job")  # before any pod exists
    policy = policy_of(objects)
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["metadata"]["name"] == objects[0]["metadata"]["name"]  # the attempt's base name
    assert policy["metadata"]["labels"][LABEL_JOB] == JOB
    body = policy["spec"]
    own = {MANAGED_BY: "kiln", LABEL_JOB: JOB, LABEL_ATTEMPT: "1"}
    assert body["podSelector"] == {"matchLabels": own}
    assert len(pod_labels(objects)) == 2 and all(selects(body["podSelector"], p) for p in pod_labels(objects))
    # Another attempt's pods (a restarted gang) are not selected, nor reached.
    assert not any(selects(body["podSelector"], p) for p in pod_labels(objects_of(spec, attempt=2)))
    assert body["policyTypes"] == ["Ingress", "Egress"]
    assert body["ingress"] == [{"from": [{"podSelector": {"matchLabels": own}}, SERVER]}]
    egress = body["egress"]
    assert egress[:3] == [DNS, {"to": [SERVER]}, {"to": [{"podSelector": {"matchLabels": own}}]}]
    assert egress[3:] == world_egress(parse_rules(RULES))


def test_none_job_reaches_only_dns_kiln_and_its_gang() -> None:
    policy = policy_of(objects_of(job_spec(network="none"), KubeConfig(job_egress=RULES)))
    own = {"podSelector": {"matchLabels": {MANAGED_BY: "kiln", LABEL_JOB: JOB, LABEL_ATTEMPT: "1"}}}
    assert policy["spec"]["ingress"] == [{"from": [own, SERVER]}]
    assert policy["spec"]["egress"] == [DNS, {"to": [SERVER]}, {"to": [own]}]
    assert "ipBlock" not in str(policy)


def test_the_rules_become_ipblocks_with_except_lists() -> None:
    v4 = "0.0.0.0/0"
    assert world_egress(parse_rules(RULES)) == [
        {
            "to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}],
            "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "UDP", "port": 443}],
        },
        {
            "to": [{"ipBlock": {"cidr": "192.168.0.0/16"}}],
            "ports": [
                {"protocol": "TCP", "port": 8000, "endPort": 8999},
                {"protocol": "UDP", "port": 8000, "endPort": 8999},
            ],
        },
        {
            "to": [
                {
                    "ipBlock": {
                        "cidr": v4,
                        "except": ["10.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12", "192.168.0.0/16"],
                    }
                },
                {"ipBlock": {"cidr": "::/0", "except": ["2001:db8::/32", "fe80::/10"]}},
            ]
        },
    ]
    # No rules: everything but the link-local (metadata) ranges.
    assert world_egress([]) == [
        {
            "to": [
                {"ipBlock": {"cidr": v4, "except": ["169.254.0.0/16"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}},
            ]
        }
    ]
    # An allow that names a metadata address opens it; a deny before an allow wins (first match).
    assert world_egress(parse_rules(["allow 169.254.169.254:80", "deny 10.0.0.0/8", "allow 10.1.0.0/16"]))[0] == {
        "to": [{"ipBlock": {"cidr": "169.254.169.254/32"}}],
        "ports": [{"protocol": "TCP", "port": 80}, {"protocol": "UDP", "port": 80}],
    }
    shadowed = world_egress(parse_rules(["deny 10.0.0.0/8", "allow 10.1.0.0/16"]))
    assert "10.1.0.0/16" not in str(shadowed)
    # Deny everything: no ipBlock at all (an except may not be the whole block).
    assert world_egress(parse_rules(["deny 0.0.0.0/0", "deny ::/0"])) == []
    # A deny of one port: the rest of the ports still reach the denied network.
    assert world_egress(parse_rules(["deny 10.0.0.0/8:22"])) == [
        {
            "to": [
                {"ipBlock": {"cidr": v4, "except": ["10.0.0.0/8", "169.254.0.0/16"]}},
                {"ipBlock": {"cidr": "::/0", "except": ["fe80::/10"]}},
            ]
        },
        {
            "to": [{"ipBlock": {"cidr": v4, "except": ["169.254.0.0/16"]}}],
            "ports": [
                {"protocol": "TCP", "port": 1, "endPort": 21},
                {"protocol": "UDP", "port": 1, "endPort": 21},
                {"protocol": "TCP", "port": 23, "endPort": 65535},
                {"protocol": "UDP", "port": 23, "endPort": 65535},
            ],
        },
    ]


Parsed = list[tuple[list[tuple[Any, list[Any]]], list[tuple[str, int, int]] | None]]


def _parsed(egress: list[dict[str, Any]]) -> Parsed:
    """Egress rules as (ipBlocks as (network, except networks), ports as (protocol, first, last) or None)."""
    out: Parsed = []
    for rule in egress:
        blocks = [
            (
                ipaddress.ip_network(p["ipBlock"]["cidr"]),
                [ipaddress.ip_network(n) for n in p["ipBlock"].get("except", [])],
            )
            for p in rule["to"]
        ]
        ports = rule.get("ports")
        out.append(
            (
                blocks,
                None if ports is None else [(e["protocol"], e["port"], e.get("endPort", e["port"])) for e in ports],
            )
        )
    return out


def _policy_allows(egress: Parsed, address: Any, protocol: str, port: int | None) -> bool:
    """What a NetworkPolicy's egress rules allow, as the API documents it (ipBlock peers only)."""
    for blocks, ports in egress:
        if not any(
            address.version == cidr.version and address in cidr and not any(address in n for n in excepted)
            for cidr, excepted in blocks
        ):
            continue
        if ports is None:
            return True
        if port is not None and any(p == protocol and first <= port <= last for p, first, last in ports):
            return True
    return False


NETWORKS = [
    "0.0.0.0/0",
    "10.0.0.0/8",
    "10.1.0.0/16",
    "10.1.2.0/24",
    "10.1.2.3/32",
    "10.128.0.0/9",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "169.0.0.0/8",
    "169.254.0.0/16",
    "169.254.169.254/32",
    "::/0",
    "2001:db8::/32",
    "2001:db8:1::/48",
    "fe80::/10",
]
PORTS: list[tuple[int, int] | None] = [None, None, None, (443, 443), (80, 90), (1, 1024), (8000, 8999), (85, 85)]
ADDRESSES = [
    "10.0.0.1",
    "10.1.0.1",
    "10.1.2.3",
    "10.1.2.4",
    "10.200.0.1",
    "172.16.5.5",
    "192.168.1.1",
    "169.254.169.254",
    "169.254.1.1",
    "169.1.1.1",
    "8.8.8.8",
    "2001:db8::1",
    "2001:db8:1::1",
    "fe80::1",
    "2606:4700::1",
]
SAMPLE_PORTS = [1, 22, 79, 80, 85, 90, 91, 443, 444, 1024, 1025, 7999, 8000, 8999, 9000, 65535]


def test_the_ipblocks_allow_exactly_what_the_rules_allow() -> None:
    """Random rule lists, first match wins (kiln.domain.egress.allowed) against the rendered ipBlocks: the same
    answer for every TCP/UDP port; for a protocol without ports (ICMP) never more, and the same where no rule
    has ports."""
    rng = random.Random(20240601)
    for _ in range(300):
        rules = [
            EgressRule(rng.choice(["allow", "deny"]), ipaddress.ip_network(rng.choice(NETWORKS)), rng.choice(PORTS))
            for _ in range(rng.randint(0, 6))
        ]
        egress = _parsed(world_egress(rules))
        portless = all(r.ports is None for r in rules)
        for address in map(ipaddress.ip_address, ADDRESSES):
            for port in SAMPLE_PORTS:
                expected = allowed(rules, address, port)
                for protocol in ("TCP", "UDP"):
                    assert _policy_allows(egress, address, protocol, port) == expected, (rules, address, port)
            icmp = _policy_allows(egress, address, "ICMP", None)
            assert icmp <= allowed(rules, address, None), (rules, address)
            if portless:
                assert icmp == allowed(rules, address, None), (rules, address)


def test_host_runs_on_the_nodes_network_without_a_policy() -> None:
    single = objects_of(job_spec(network="host"))
    assert [o["kind"] for o in single] == ["Secret", "ConfigMap", "Job"]
    pod = single[-1]["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    assert "ports" not in pod["containers"][0]
    gang = objects_of(job_spec(network="host", distributed={"framework": "pytorch", "workers": 2}))
    assert "NetworkPolicy" not in [o["kind"] for o in gang]
    (job,) = [o for o in gang if o["kind"] == "Job"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["ports"] == [{"name": "rendezvous", "containerPort": 29500, "hostPort": 29500, "protocol": "TCP"}]
    # Isolated and none pods stay on the pod network.
    assert "hostNetwork" not in objects_of(job_spec())[-1]["spec"]["template"]["spec"]
    with pytest.raises(InvalidInput, match="MPI gang"):
        objects_of(
            job_spec(
                network="host",
                command="$KILN_MPI_LAUNCHER python train.py",
                distributed={"framework": "mpi", "workers": 2},
            )
        )


# -- model services ----------------------------------------------------------------------------------------------


def service_objects(cfg: KubeConfig | None = None, service_id: str = "svc-1") -> list[dict[str, Any]]:
    spec = ServiceSpec.model_validate(
        {"name": "digits", "model": "digits@production", "predictor": {"type": "sklearn"}}
    )
    return render_service(service_id, ORG, spec, ("digits", 3), cfg or KubeConfig(), token="t", replica_secret="s")


def test_a_service_is_reached_only_by_kiln_on_the_replica_port() -> None:
    objects = service_objects(KubeConfig(job_egress=RULES))
    kinds = [o["kind"] for o in objects]
    assert kinds.index("NetworkPolicy") < kinds.index("Deployment")
    body = policy_of(objects)["spec"]
    assert [selects(body["podSelector"], p) for p in pod_labels(objects)] == [True]
    assert not any(selects(body["podSelector"], p) for p in pod_labels(service_objects(service_id="svc-2")))
    assert not any(selects(body["podSelector"], p) for p in pod_labels(objects_of(job_spec())))
    assert body["ingress"] == [{"from": [SERVER], "ports": [{"protocol": "TCP", "port": REPLICA_PORT}]}]
    assert body["egress"] == [DNS, {"to": [SERVER]}, *world_egress(parse_rules(RULES))]


# -- settings and validation -------------------------------------------------------------------------------------


def test_server_pods_elsewhere_and_other_dns_labels() -> None:
    cfg = KubeConfig(
        namespace="ml-jobs",
        server_namespace="kiln-system",
        server_pod_labels={"app": "kiln"},
        dns_pod_labels={"k8s-app": "coredns"},
    )
    body = policy_of(objects_of(job_spec(network="none"), cfg))["spec"]
    server = {
        "podSelector": {"matchLabels": {"app": "kiln"}},
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kiln-system"}},
    }
    assert body["ingress"][0]["from"][1] == server
    assert body["egress"][0]["to"] == [
        {"namespaceSelector": {}, "podSelector": {"matchLabels": {"k8s-app": "coredns"}}}
    ]
    assert body["egress"][1] == {"to": [server]}
    same = KubeConfig(namespace="kiln", server_namespace="kiln")  # the jobs' own namespace: no namespaceSelector
    assert policy_of(objects_of(job_spec(), same))["spec"]["egress"][1] == {"to": [SERVER]}


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"job_egress": ["deny 10.0.0.0/8", "allow everything"]}, "'allow everything'"),
        ({"server_pod_labels": {}}, "server_pod_labels must name at least one label"),
        ({"dns_pod_labels": {"k8s app": "kube-dns"}}, "not a valid Kubernetes label selector"),
        ({"server_namespace": "Kiln_System"}, "server_namespace"),
    ],
)
def test_bad_network_settings_are_refused(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=says):
        KubeConfig(**fields)


def test_the_server_settings_reach_the_render(tmp_path: Path) -> None:
    settings = Settings(
        home=tmp_path,
        job_egress="deny 10.0.0.0/8; allow [2001:db8::/32]:443",
        network_host_orgs="acme, org-2",
    )
    cfg = kube_config(KubernetesSettings(), **job_network(settings))
    assert cfg.job_egress == ["deny 10.0.0.0/8", "allow [2001:db8::/32]:443"]
    assert cfg.network_host_orgs == ["acme", "org-2"]
    assert cfg.server_pod_labels == {"app.kubernetes.io/name": "kiln", "app.kubernetes.io/component": "server"}
    assert cfg.egress_rules == parse_rules(cfg.job_egress)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.needs("kubernetes-validate")
def test_policies_validate_strictly(version: str) -> None:
    cfg = KubeConfig(
        job_egress=[*RULES, "allow [2001:db8:1::/48]:8000-8999", "deny 10.0.0.0/8:22", "allow 169.254.169.254:80"],
        server_namespace="kiln-system",
        kubernetes_version=version,
    )
    gang = {"distributed": {"framework": "pytorch", "workers": 2}}
    for fields in ({}, {"network": "none"}, gang, {"network": "none", **gang}, {"network": "host", **gang}):
        validate_strict(objects_of(job_spec(**fields), cfg), version)
    validate_strict(service_objects(cfg), version)
    for rules in ([], ["deny 0.0.0.0/0", "deny ::/0"], ["allow 0.0.0.0/0:443", "deny 0.0.0.0/0"]):
        validate_strict(objects_of(job_spec(), KubeConfig(job_egress=rules, kubernetes_version=version)), version)
