"""What the local executor's jobs may reach on the network, and whether this machine can give them a network of
their own.

Every sandboxed attempt gets its own network namespace (``injob/netns.py`` makes it, shared by a gang's members
on this machine), so a job never shares the machine's loopback, its listening services (databases, caches,
brokers, another job's port) or its other addresses:

- ``network: isolated`` (the default): the outside world through ``pasta`` (passt's user-mode stack, chosen over
  slirp4netns because it forwards a loopback port by splicing sockets, at memory speed, and exits by itself when
  the namespace goes away), under the operator's egress rules (``KILN_JOB_EGRESS``, :mod:`kiln.domain.egress`)
  loaded as nftables rules into the job's own namespace; the machine's addresses are copied into the namespace
  (there they name the job itself), the gateway is not mapped to the machine's loopback, and of the machine's
  loopback only the Kiln API's port (the job's token reaches the API as ``http://127.0.0.1:PORT``) and the
  ports the operator allows are forwarded.
- ``network: none``: loopback and the Kiln API only, with no process of its own: the shim of each member listens
  on the job's ``127.0.0.1:PORT`` from inside the namespace and forwards what connects there to the API, bounded
  (``injob/apiport.py``, which says why it is done this way). It needs no pasta nor nft: a machine without them
  still gives jobs ``none``.
- ``network: host``: the machine's network, refused unless the organisation is in ``KILN_NETWORK_HOST_ORGS``.

With ``KILN_SANDBOX=none`` (the operator's opt-out of all isolation) jobs share the machine's network.
"""

from __future__ import annotations

import ipaddress
import logging
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from kiln.domain.egress import EgressRule, effective_rules
from kiln.injob import netns
from kiln.settings import Settings

log = logging.getLogger(__name__)

API_CONNECTIONS = 32  # network: none: connections to the Kiln API forwarded at once per member (apiport.py)


@dataclass(frozen=True)
class Networking:
    """Which job networks this machine can give (found once, when the server starts)."""

    available: bool  # jobs get a namespace of their own: network: none at least
    detail: str  # what the server logs at start (and, when not available, why)
    pasta: str | None = None
    nft: str | None = None
    isolated: bool = True  # network: isolated as well (pasta and nft are here and work); else why not in detail

    @property
    def modes(self) -> tuple[str, ...]:
        """The namespaced modes this machine gives."""
        if not self.available:
            return ()
        return ("isolated", "none") if self.isolated else ("none",)

    def problem(self, mode: str) -> str | None:
        """Why a job asking for ``mode`` is refused here, or None."""
        if mode == "host" or mode in self.modes:
            return None
        if not self.available:
            return (
                f"this server cannot give jobs a network of their own ({self.detail}); install passt and nftables "
                "(apt-get install passt nftables), or ask for network: host where the operator allows it"
            )
        return (
            f"this server cannot give jobs the outside world under its egress rules ({self.detail}); install "
            "passt and nftables (apt-get install passt nftables), or ask for network: none"
        )


def detect(settings: Settings, sandboxed: bool) -> Networking:
    """Which job networks can be made here: a namespace of each mode is made and removed at start."""
    if not sandboxed:
        return Networking(False, "jobs are not sandboxed (KILN_SANDBOX=none): they share the machine's network")
    failed = _probe({"mode": "none", "forward": [], "rules": "", "api": {"port": 0, "target": ["127.0.0.1", 0]}})
    if failed:
        return Networking(False, f"a job's network namespace cannot be made here: {failed}")
    pasta, nft = _which("pasta"), _which("nft")
    why = ""
    if pasta is None or nft is None:
        why = "pasta (passt) is not installed" if pasta is None else "nft (nftables) is not installed"
    if not why:
        failed = _probe({"mode": "isolated", "pasta": pasta, "nft": nft, "forward": [], "rules": nft_script([])})
        why = f"a job's connected network cannot be made here: {failed}" if failed else ""
    if why:
        return Networking(
            True,
            f"each job has a network namespace of its own, but network: isolated is refused ({why}): network: none "
            "(its own loopback and the Kiln API) only",
            isolated=False,
        )
    return Networking(
        True,
        "each job has a network namespace of its own (isolated: pasta for the outside world under KILN_JOB_EGRESS, "
        "the Kiln API forwarded; none: the Kiln API only, forwarded by its shim; nothing of the machine's loopback "
        "or addresses)",
        pasta,
        nft,
    )


def _probe(cfg: dict[str, Any]) -> str:
    """A namespace of ``cfg``'s mode made and removed: "" when it worked, else why not."""
    with tempfile.TemporaryDirectory(prefix="kiln-net-probe-") as top:
        try:
            net = netns.JobNetwork({**cfg, "dir": top})
            try:
                net.acquire("probe")
                net.release("probe")
            finally:
                net.close()
        except (netns.NetworkError, OSError) as exc:
            netns.cleanup(top)
            return str(exc)
    return ""


def _which(tool: str) -> str | None:
    """``tool`` on PATH, else where Debian puts it (nft is in /usr/sbin, which a non-login PATH may lack)."""
    found = shutil.which(tool)
    if found is None:
        found = next((p for p in (f"/usr/sbin/{tool}", f"/sbin/{tool}", f"/usr/bin/{tool}") if Path(p).exists()), None)
    return found


def attempt_network(
    networking: Networking, settings: Settings, mode: str, job_id: str, attempt: int
) -> dict[str, Any] | None:
    """The ``"network"`` entry of each member's ``shim.json`` (None: the machine's network)."""
    if mode == "host" or not networking.available:
        return None
    if mode != "isolated":  # none: no pasta; each member's shim serves the API's port (injob/apiport.py)
        return {
            "mode": mode,
            "dir": str(network_dir(settings, job_id, attempt)),
            "pasta": None,
            "nft": None,
            "forward": [],
            "rules": "",
            "api": {"port": settings.port, "target": ["127.0.0.1", settings.port], "connections": API_CONNECTIONS},
        }
    rules = settings.egress_rules
    return {
        "mode": mode,
        "dir": str(network_dir(settings, job_id, attempt)),
        "pasta": networking.pasta,
        "nft": networking.nft,
        "forward": sorted({settings.port, *_loopback_ports(rules)}),
        "rules": nft_script(rules, machine_addresses()),
    }


def network_dir(settings: Settings, job_id: str, attempt: int) -> Path:
    return settings.run_dir / "net" / f"{job_id}-{attempt}"


def job_endpoint(settings: Settings) -> str:
    """The Kiln API as a job in a namespace of its own reaches it, in every mode: its own loopback's port, forwarded
    to the API's (by pasta under isolated, by the shim under none)."""
    return f"http://127.0.0.1:{settings.port}"


def _loopback_ports(rules: list[EgressRule]) -> list[int]:
    """The machine's loopback ports the operator allows jobs (``allow 127.0.0.1:3128``): forwarded from the
    job's own loopback (a range is capped at 256 ports)."""
    ports: set[int] = set()
    for rule in rules:
        if rule.action == "allow" and rule.network.is_loopback and rule.ports is not None:
            lo, hi = rule.ports
            ports.update(range(lo, min(hi, lo + 255) + 1))
    return sorted(ports)


def machine_addresses() -> list[str]:
    """This machine's own addresses other than loopback (a job must not reach its services through them)."""
    found: set[str] = set()
    for addrs in psutil.net_if_addrs().values():
        for addr in addrs:
            text = addr.address.split("%")[0]
            try:
                ip = ipaddress.ip_address(text)
            except ValueError:
                continue  # a MAC address
            if not ip.is_loopback and not ip.is_link_local:
                found.add(str(ip))
    return sorted(found, key=lambda a: (":" in a, a))


def nft_script(rules: list[EgressRule], machine: list[str] | None = None) -> str:
    """The job's egress as nftables rules for its own namespace: its loopback, then the machine's addresses
    denied, then the operator's rules in order, then link-local denied; anything else leaves through pasta."""
    lines = [
        "table inet kiln {",
        "  chain egress {",
        "    type filter hook output priority 0; policy accept;",
        '    oif "lo" accept',
    ]
    for address in machine or []:
        family = "ip6" if ":" in address else "ip"
        lines.append(f"    {family} daddr {address} reject with icmpx type admin-prohibited")
    for rule in effective_rules(rules):
        if rule.network.is_loopback:
            continue  # the job's loopback is its own; the allowed loopback ports are forwarded by pasta
        match = _match(rule.network, rule.ports)
        if rule.action == "deny" and rule.network.version == 6 and rule.network.is_link_local and not rule.ports:
            match += " meta l4proto { tcp, udp }"  # IPv6 link-local carries neighbour discovery: only connections
        lines.append(f"    {match} {_verdict(rule.action)}")
    lines += ["  }", "}", ""]
    return "\n".join(lines)


def _match(network: Any, ports: tuple[int, int] | None) -> str:
    family = "ip6" if network.version == 6 else "ip"
    text = f"{family} daddr {network}"
    if ports is not None:
        lo, hi = ports
        text += f" meta l4proto {{ tcp, udp }} th dport {lo if lo == hi else f'{lo}-{hi}'}"
    return text


def _verdict(action: str) -> str:
    return "accept" if action == "allow" else "reject with icmpx type admin-prohibited"
