"""Whether the namespace's NetworkPolicies let a client reach a pod's port, as a
policy-enforcing CNI decides it.

A pod no policy (with ``Ingress`` in its ``policyTypes``) selects accepts every
connection. A selected pod accepts one only if some ingress rule of a policy
selecting it admits both the port (``ports`` absent or empty: every port; a number,
a range with ``endPort``, or the name of one of the pod's container ports; TCP when
no protocol is given) and the client (``from`` absent or empty: everyone; a
``podSelector`` alone picks pods of the policy's namespace, with a
``namespaceSelector`` pods of the namespaces it picks; an ``ipBlock`` the client's
address, less its ``except``)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from tests.support.k8s_api.resources import Obj
from tests.support.k8s_api.selectors import label_selector


@dataclass(frozen=True)
class Client:
    """Who connects: a pod's labels, its namespace (and that namespace's labels), its
    address."""

    labels: dict[str, str] = field(
        default_factory=lambda: {"app.kubernetes.io/name": "framerelay-orchestrator"}
    )
    namespace: str = "framerelay"
    namespace_labels: dict[str, str] = field(default_factory=dict)
    ip: str = "127.0.0.1"

    def ns_labels(self) -> dict[str, str]:
        return {"kubernetes.io/metadata.name": self.namespace, **self.namespace_labels}


def policy_types(policy: Obj) -> list[str]:
    spec = policy["spec"]
    return list(spec.get("policyTypes") or ["Ingress", *(["Egress"] if "egress" in spec else [])])


def selecting(policies: list[Obj], pod: Obj) -> list[Obj]:
    """The policies of the pod's namespace that select it for ingress."""
    labels = pod["metadata"].get("labels") or {}
    ns = pod["metadata"].get("namespace")
    return [
        p
        for p in policies
        if p["metadata"].get("namespace") == ns
        and "Ingress" in policy_types(p)
        and label_selector(p["spec"].get("podSelector"))(labels)
    ]


def admitted(policies: list[Obj], pod: Obj, port: int, client: Client) -> bool:
    """Whether ``client`` may open a TCP connection to ``port`` of ``pod``."""
    chosen = selecting(policies, pod)
    if not chosen:
        return True
    return any(
        _port_ok(rule, pod, port) and _peer_ok(rule, policy, client)
        for policy in chosen
        for rule in policy["spec"].get("ingress") or []
    )


def _port_ok(rule: Obj, pod: Obj, port: int) -> bool:
    ports = rule.get("ports") or []
    if not ports:
        return True
    names = {
        p.get("name"): p["containerPort"]
        for c in pod["spec"]["containers"]
        for p in c.get("ports", [])
        if p.get("name")
    }
    for p in ports:
        if p.get("protocol", "TCP") != "TCP":
            continue
        want = p.get("port")
        if want is None:
            return True
        if isinstance(want, str):
            if names.get(want) == port:
                return True
            continue
        if want <= port <= int(p.get("endPort", want)):
            return True
    return False


def _peer_ok(rule: Obj, policy: Obj, client: Client) -> bool:
    peers = rule.get("from") or []
    return not peers or any(_peer_matches(peer, policy, client) for peer in peers)


def _peer_matches(peer: Obj, policy: Obj, client: Client) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        ip = ipaddress.ip_address(client.ip)
        inside = ip in ipaddress.ip_network(block["cidr"], strict=False)
        return inside and not any(
            ip in ipaddress.ip_network(e, strict=False) for e in block.get("except") or []
        )
    if "namespaceSelector" in peer:
        ns_ok = label_selector(peer["namespaceSelector"])(client.ns_labels())
    else:
        ns_ok = client.namespace == policy["metadata"].get("namespace")
    pods_ok = "podSelector" not in peer or label_selector(peer["podSelector"])(client.labels)
    return ns_ok and pods_ok
