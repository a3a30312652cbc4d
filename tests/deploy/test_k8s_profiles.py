"""What the kubernetes provider renders for a tier: its scheduling profile (ready-made
spot profiles that select and tolerate exactly their provider's spot nodes, ACS's pod
labels, overrides), CPU and memory scaled by GPU count, a NetworkPolicy that admits every
port the pod listens on, the tier's PodDisruptionBudget, every object valid for the
oldest and newest Kubernetes supported and under the restricted Pod Security Standard,
the settings that refuse a profile that cannot be, and docs/kubernetes.md's worked
examples, loaded and rendered as written."""

from __future__ import annotations

import logging
import re
import shlex
from typing import Any

import pytest
from pydantic import ValidationError

from deploy.models import PodSpec
from deploy.providers.kubernetes.profiles import (
    BUILTIN_PROFILES,
    SPOT_PROFILES,
    SchedulingProfile,
    profile_for,
)
from deploy.providers.kubernetes.render import (
    render_disruption_budget,
    render_pod,
    render_pod_objects,
    worker_ports,
)
from deploy.settings import KubernetesSettings, OrchestratorSettings, TierConfig
from tests.conftest import ROOT
from tests.deploy.k8s_checks import (
    K8S_VERSIONS,
    Obj,
    admitted_ports,
    deployment_problems,
    schema_problems,
    service_problems,
    unfit,
)

Node = tuple[dict[str, str], list[Obj]]


def _taint(key: str, value: str, effect: str = "NoSchedule") -> Obj:
    return {"key": key, "value": value, "effect": effect}


GPU_TAINT = _taint("nvidia.com/gpu", "present")  # GKE's; EKS/Karpenter GPU pools alike
SPOT_NODES: dict[str, Node] = {
    "gke-spot": (
        {"cloud.google.com/gke-spot": "true", "cloud.google.com/gke-accelerator": "nvidia-l4"},
        [_taint("cloud.google.com/gke-spot", "true"), GPU_TAINT],
    ),
    "eks-spot": (
        {"eks.amazonaws.com/capacityType": "SPOT", "eks.amazonaws.com/nodegroup": "gpu-spot"},
        [GPU_TAINT],
    ),
    "karpenter-spot": ({"karpenter.sh/capacity-type": "spot"}, [GPU_TAINT]),
    "aks-spot": (
        {"kubernetes.azure.com/scalesetpriority": "spot", "kubernetes.azure.com/agentpool": "g"},
        [_taint("kubernetes.azure.com/scalesetpriority", "spot")],
    ),
}
"""A spot GPU node of each managed service: its real labels and taints."""
ON_DEMAND_NODES: dict[str, Node] = {
    "gke-spot": ({"cloud.google.com/gke-accelerator": "nvidia-l4"}, [GPU_TAINT]),
    "eks-spot": ({"eks.amazonaws.com/capacityType": "ON_DEMAND"}, [GPU_TAINT]),
    "karpenter-spot": ({"karpenter.sh/capacity-type": "on-demand"}, [GPU_TAINT]),
    "aks-spot": ({"kubernetes.azure.com/agentpool": "gpu"}, []),
}
"""The same services' on-demand GPU nodes."""
INGEST = {"app.kubernetes.io/name": "framerelay-ingest", "app.kubernetes.io/part-of": "framerelay"}
ORCHESTRATOR = {"app.kubernetes.io/name": "framerelay-orchestrator"}
SCRAPER = {"framerelay.io/metrics-scraper": "true", "app": "prometheus"}


def _spec(tier: str = "t", gpus: int = 1) -> PodSpec:
    return PodSpec(name=f"fr-{tier}-0-g0", tier=tier, gpu_types=("L4",), spot=False, gpu_count=gpus)


def _pod(profile: dict[str, Any] | None, gpus: int = 1) -> Obj:
    settings = KubernetesSettings(profiles={} if profile is None else {"t": profile})
    return render_pod(_spec(gpus=gpus), settings)


@pytest.mark.parametrize("name", sorted(SPOT_NODES))
def test_each_spot_profile_selects_and_tolerates_exactly_its_providers_spot_nodes(
    name: str,
) -> None:
    pod = _pod({"base": name})
    labels, taints = SPOT_NODES[name]
    assert unfit(pod, labels, taints) is None
    assert unfit(pod, *ON_DEMAND_NODES[name]) is not None  # its on-demand nodes: no
    for other, node in SPOT_NODES.items():
        if other != name:
            assert unfit(pod, *node) is not None, other  # another service's spot nodes: no
    spot_label = {k: v for k, v in labels.items() if k in pod["spec"]["nodeSelector"]}
    assert pod["spec"]["nodeSelector"] == spot_label  # the one spot label, nothing more
    tolerated = {t["key"] for t in pod["spec"]["tolerations"]}
    assert tolerated == {"nvidia.com/gpu"} | {t["key"] for t in taints}
    assert BUILTIN_PROFILES[name].selects_spot


@pytest.mark.parametrize(
    ("name", "selector", "tolerations"),
    [
        (
            "gke-spot",
            {"cloud.google.com/gke-spot": "true"},
            [
                {
                    "key": "cloud.google.com/gke-spot",
                    "operator": "Equal",
                    "value": "true",
                    "effect": "NoSchedule",
                }
            ],
        ),
        ("eks-spot", {"eks.amazonaws.com/capacityType": "SPOT"}, []),
        ("karpenter-spot", {"karpenter.sh/capacity-type": "spot"}, []),
        (
            "aks-spot",
            {"kubernetes.azure.com/scalesetpriority": "spot"},
            [
                {
                    "key": "kubernetes.azure.com/scalesetpriority",
                    "operator": "Equal",
                    "value": "spot",
                    "effect": "NoSchedule",
                }
            ],
        ),
    ],
)
def test_the_spot_profiles_use_the_names_each_provider_documents(
    name: str, selector: dict[str, str], tolerations: list[Obj]
) -> None:
    spec = _pod({"base": name})["spec"]
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    assert spec["nodeSelector"] == selector
    assert spec["tolerations"] == [gpu, *tolerations]


def test_the_gpu_profile_tolerates_the_gpu_taint_and_a_pod_without_it_stays_off() -> None:
    gpu_node: Node = ({"cloud.google.com/gke-accelerator": "nvidia-l4"}, [GPU_TAINT])
    assert unfit(_pod(None), *gpu_node) is None
    assert unfit(_pod({"base": None}), *gpu_node) == (
        "untolerated taint nvidia.com/gpu=present:NoSchedule"
    )
    assert not BUILTIN_PROFILES["gpu"].selects_spot


def test_the_acs_profiles_render_acs_pod_labels() -> None:
    series = {"alibabacloud.com/gpu-model-series": "T4"}
    pod = _pod({"base": "acs", "labels": series})
    labels = pod["metadata"]["labels"]
    assert labels["alibabacloud.com/compute-class"] == "gpu"
    assert labels["alibabacloud.com/gpu-model-series"] == "T4"
    assert "alibabacloud.com/compute-qos" not in labels
    assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    best = _pod({"base": "acs-best-effort", "labels": series})["metadata"]["labels"]
    assert best["alibabacloud.com/compute-qos"] == "best-effort"
    assert (
        not BUILTIN_PROFILES["acs"].selects_spot
        and BUILTIN_PROFILES["acs-best-effort"].selects_spot
    )
    with pytest.raises(ValidationError, match=r"alibabacloud\.com/gpu-model-series"):
        KubernetesSettings(profiles={"t": {"base": "acs"}})


@pytest.mark.parametrize("gpus", [1, 2, 8])
def test_the_network_policy_admits_every_port_the_pod_listens_on(gpus: int) -> None:
    settings = KubernetesSettings(peer_cidrs=["10.20.0.0/16"])
    secret_less = render_pod_objects(_spec(gpus=gpus), settings)
    policy, service, pod = secret_less
    listening = set(worker_ports(pod))
    assert listening == {8443 + k for k in range(gpus)}
    assert listening == {p["containerPort"] for c in pod["spec"]["containers"] for p in c["ports"]}
    for peer in (INGEST, ORCHESTRATOR):
        assert admitted_ports(policy, peer) == listening
    assert admitted_ports(policy, SCRAPER, namespace="monitoring") == listening
    assert admitted_ports(policy, INGEST, namespace="elsewhere") == set()  # same namespace only
    assert admitted_ports(policy, {"app.kubernetes.io/name": "redis"}) == set()
    assert {"ipBlock": {"cidr": "10.20.0.0/16"}} in policy["spec"]["ingress"][0]["from"]
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"framerelay/pod": pod["metadata"]["name"]}
    }
    assert policy["spec"]["egress"] == [] and "Egress" in policy["spec"]["policyTypes"]
    assert {p["port"] for p in service["spec"]["ports"]} == listening
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": str(2 * gpus), "memory": f"{4 * gpus}Gi"}
    assert resources["limits"] == {
        "cpu": str(4 * gpus),
        "memory": f"{8 * gpus}Gi",
        "nvidia.com/gpu": gpus,
    }


def test_cpu_memory_and_the_gpu_resource_follow_the_profile() -> None:
    profile = {
        "gpu_resource": "nvidia.com/mig-1g.10gb",
        "requests_per_gpu": {"cpu": 0.5, "memory_gib": 1.5},
        "limits_per_gpu": {"cpu": 1, "memory_gib": 2},
    }
    resources = _pod(profile, gpus=3)["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "1500m", "memory": "4608Mi"}
    assert resources["limits"] == {"cpu": "3", "memory": "6Gi", "nvidia.com/mig-1g.10gb": 3}


FULL = {
    "base": "gke-spot",
    "tolerations": [
        {"key": "dedicated", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}
    ],
    "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-l4"},
    "affinity": {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {
                    "weight": 50,
                    "preference": {
                        "matchExpressions": [
                            {
                                "key": "topology.kubernetes.io/zone",
                                "operator": "In",
                                "values": ["eu-a"],
                            }
                        ]
                    },
                }
            ]
        }
    },
    "runtime_class_name": "nvidia",
    "labels": {"team": "vision"},
    "annotations": {"cluster-autoscaler.kubernetes.io/safe-to-evict": "true"},
    "image_pull_secrets": ["regcred"],
    "topology_spread": [
        {
            "topology_key": "topology.kubernetes.io/zone",
            "max_skew": 2,
            "when_unsatisfiable": "DoNotSchedule",
        }
    ],
}
SERIES = {"alibabacloud.com/gpu-model-series": "T4"}
PROFILES = [
    *({"base": n} for n in BUILTIN_PROFILES if not n.startswith("acs")),
    {"base": "acs", "labels": SERIES},
    {"base": "acs-best-effort", "labels": SERIES},
    {"base": None},
    FULL,
]


@pytest.mark.parametrize("gpus", [1, 8])
@pytest.mark.parametrize("profile", PROFILES, ids=lambda p: str(p.get("base")))
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_every_rendered_object_is_valid_and_restricted(
    version: str, profile: dict[str, Any], gpus: int
) -> None:
    settings = KubernetesSettings(profiles={"t": profile}, peer_cidrs=["192.0.2.0/24"])
    spec = _spec(gpus=gpus)
    objects = [*render_pod_objects(spec, settings), render_disruption_budget("t", 2, settings)]
    assert [p for o in objects for p in schema_problems(o, version)] == []
    _policy, service, pod, _budget = objects
    assert deployment_problems(pod) == [] and service_problems(service, [pod]) == []


def test_a_profile_overrides_its_base_field_by_field() -> None:
    pod = _pod(FULL)
    spec, labels = pod["spec"], pod["metadata"]["labels"]
    assert spec["nodeSelector"] == {
        "cloud.google.com/gke-spot": "true",
        "cloud.google.com/gke-accelerator": "nvidia-l4",
    }  # merged
    assert [t["key"] for t in spec["tolerations"]] == [
        "nvidia.com/gpu",
        "cloud.google.com/gke-spot",
        "dedicated",
    ]  # added to
    assert spec["tolerations"][-1]["tolerationSeconds"] == 30
    assert [s["topologyKey"] for s in spec["topologySpreadConstraints"]] == [
        "kubernetes.io/hostname",
        "topology.kubernetes.io/zone",
    ]
    spread = spec["topologySpreadConstraints"][0]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"]["framerelay/tier"] == "t"
    assert spec["runtimeClassName"] == "nvidia" and spec["imagePullSecrets"] == [
        {"name": "regcred"}
    ]
    assert spec["affinity"] == FULL["affinity"]
    assert labels["team"] == "vision" and labels["framerelay/pod"] == "fr-t-0-g0"
    assert pod["metadata"]["annotations"] == FULL["annotations"]
    bare = _pod({"base": None})["spec"]
    assert not {"tolerations", "nodeSelector", "topologySpreadConstraints"} & set(bare)


def test_the_old_node_selector_is_read_under_every_profile_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        settings = KubernetesSettings(
            node_selector={"pool": "gpu", "karpenter.sh/capacity-type": "on-demand"},
            profiles={"spot": {"base": "karpenter-spot"}},
        )
    assert "node_selector is deprecated" in caplog.text
    assert profile_for(settings, "ondemand").node_selector == {
        "pool": "gpu",
        "karpenter.sh/capacity-type": "on-demand",
    }
    assert profile_for(settings, "spot").node_selector == {
        "pool": "gpu",
        "karpenter.sh/capacity-type": "spot",
    }  # the tier's own wins


@pytest.mark.parametrize(
    ("profile", "message"),
    [
        ({"labels": {"framerelay/pod": "x"}}, "is the orchestrator's"),
        ({"labels": {"framerelay.io/api-client": "true"}}, "admit network peers"),
        ({"labels": {"team": "a b"}}, "is no label value"),
        ({"node_selector": {"-bad": "x"}}, "is no label key"),
        ({"gpu_resource": "gpu"}, "gpu_resource"),
        ({"gpu_resource": "nvidia.com/GPU"}, "gpu_resource"),
        ({"limits_per_gpu": {"cpu": 1, "memory_gib": 8}}, "limits_per_gpu.cpu is below"),
        ({"affinity": {"nodeSelector": {}}}, "is none of nodeAffinity"),
        ({"tolerations": [{"key": "a", "operator": "Exists", "value": "b"}]}, "takes no value"),
        ({"tolerations": [{"key": "a", "value": "b", "tolerationSeconds": 5}]}, "NoExecute"),
        ({"base": "gke"}, "base"),
        ({"runtime_class_name": "Nvidia"}, "runtime_class_name"),
        ({"topology_spread": [{"when_unsatisfiable": "Never"}]}, "when_unsatisfiable"),
        ({"nodeSelector": {"a": "b"}}, "nodeSelector"),
    ],
)
def test_a_bad_profile_is_refused_with_the_field(profile: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        KubernetesSettings(profiles={"t": profile})


def _tiers(**profiles: dict[str, Any]) -> dict[str, Any]:
    tiers = [TierConfig(name="ondemand"), TierConfig(name="cheap", interruptible=True)]
    return {"provider": "kubernetes", "tiers": tiers, "kubernetes": {"profiles": profiles}}


def test_the_tiers_and_their_profiles_must_agree_on_spot() -> None:
    with pytest.raises(
        ValidationError,
        match="tier cheap is interruptible but its Kubernetes "
        r"profile selects no spot nodes: give it one of the spot profiles "
        r"\(gke-spot, eks-spot, karpenter-spot, aks-spot, acs-best-effort\)",
    ):
        OrchestratorSettings(**_tiers())
    with pytest.raises(ValidationError, match="tier ondemand's Kubernetes profile selects spot"):
        OrchestratorSettings(**_tiers(ondemand={"base": "aks-spot"}, cheap={"base": "aks-spot"}))
    with pytest.raises(ValidationError, match="'cheapo' is no tier"):
        OrchestratorSettings(**_tiers(cheap={"base": "eks-spot"}, cheapo={}))
    own = {"node_selector": {"node.kubernetes.io/lifecycle": "spot"}, "spot_nodes": True}
    for cheap in ({"base": "eks-spot"}, own):
        settings = OrchestratorSettings(**_tiers(cheap=cheap))
        assert profile_for(settings.kubernetes, "cheap").selects_spot
    assert set(SPOT_PROFILES) == {n for n, p in BUILTIN_PROFILES.items() if p.selects_spot}
    # other providers never read the profiles
    OrchestratorSettings(**{**_tiers(), "provider": "local"})


def test_the_disruption_budget_keeps_a_tiers_floor() -> None:
    budget = render_disruption_budget("ondemand", 2, KubernetesSettings(namespace="gpu"))
    assert budget["metadata"]["name"] == "framerelay-ondemand"
    assert budget["metadata"]["namespace"] == "gpu"
    assert budget["spec"]["minAvailable"] == 2 and "maxUnavailable" not in budget["spec"]
    assert budget["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/managed-by": "framerelay-orchestrator",
        "framerelay/tier": "ondemand",
    }
    pod = render_pod(_spec("ondemand"), KubernetesSettings(namespace="gpu"))
    assert budget["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    assert budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    with pytest.raises(ValueError, match="min_available"):
        render_disruption_budget("ondemand", -1, KubernetesSettings())


def test_worker_ports_reads_a_pod_as_the_api_returns_it() -> None:
    pod = render_pod(_spec(gpus=3), KubernetesSettings())
    assert worker_ports(pod) == [8443, 8444, 8445]
    assert worker_ports({"spec": {"containers": [{"name": "sidecar", "ports": []}]}}) == []
    assert worker_ports({}) == []


DOC = ROOT / "docs" / "kubernetes.md"
EXAMPLE = re.compile(
    r"<!-- tested: tests/deploy/test_k8s_profiles\.py -->\n```sh\n(.*?)```", re.DOTALL
)


def _examples() -> list[dict[str, str]]:
    """docs/kubernetes.md's worked examples: the variables each block exports."""
    found = []
    for block in EXAMPLE.findall(DOC.read_text(encoding="utf-8")):
        words = [w for w in shlex.split(block) if w != "export"]
        found.append(dict(w.split("=", 1) for w in words))
    return found


def test_the_docs_have_a_worked_example_per_managed_service() -> None:
    profiles = [e["FRAMERELAY_ORCH_KUBERNETES__PROFILES"] for e in _examples()]
    assert len(profiles) == 4
    for base in ("gke-spot", "eks-spot", "aks-spot", "acs-best-effort"):
        assert sum(f'"base": "{base}"' in p for p in profiles) == 1, base


@pytest.mark.parametrize(
    "example", _examples(), ids=lambda e: e["FRAMERELAY_ORCH_KUBERNETES__PROFILES"][:40]
)
def test_each_worked_example_loads_and_renders(
    example: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in example.items():
        monkeypatch.setenv(name, value)
    settings = OrchestratorSettings()
    assert settings.provider == "kubernetes" and len(settings.tiers) == 2
    for tier in settings.tiers:
        assert profile_for(settings.kubernetes, tier.name).selects_spot is tier.interruptible
        objects = render_pod_objects(_spec(tier.name, gpus=2), settings.kubernetes)
        for version in K8S_VERSIONS:
            assert [p for o in objects for p in schema_problems(o, version)] == []
        assert deployment_problems(objects[-1]) == []


def test_a_profile_is_resolved_once_into_a_whole_profile() -> None:
    resolved = SchedulingProfile.model_validate({"base": "aks-spot"}).resolved()
    assert resolved.base is None and resolved == BUILTIN_PROFILES["aks-spot"]
    assert resolved.resolved() is resolved
