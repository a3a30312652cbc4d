"""Scheduling profiles: where a tier's worker pods may run on a Kubernetes cluster.

A profile says which nodes a pod selects (``node_selector``, ``affinity``) and
tolerates (``tolerations``), its runtime class, extra labels and annotations, image
pull secrets, how a tier's pods spread over nodes and zones, which extended resource
is its GPU (``nvidia.com/gpu``, a MIG slice such as ``nvidia.com/mig-1g.10gb``, a
time-sliced share) and the CPU and memory each GPU's worker gets. A tier's profile
starts from a ready-made one (``base``, ``gpu`` unless told) and overrides it:
mappings merge (the tier's keys win), lists add to the base's, the rest replaces.

The ready-made profiles and the names they use, as each provider documents them:

* ``gpu``: tolerates the ``nvidia.com/gpu`` taint (NoSchedule, any value) that GKE
  (``nvidia.com/gpu=present``), EKS GPU node groups, Karpenter GPU node pools and
  most NVIDIA GPU Operator installs put on GPU nodes, so the pod schedules where the
  ExtendedResourceToleration admission plugin is off (Azure/AKS issue 1449).
* ``gke-spot``: GKE Spot VMs, node label ``cloud.google.com/gke-spot=true``; GKE's
  "Use Spot VMs" page taints such pools ``cloud.google.com/gke-spot="true":NoSchedule``
  (Autopilot does so itself), so the pod tolerates that too.
* ``eks-spot``: EKS managed node groups of capacity type SPOT label their nodes
  ``eks.amazonaws.com/capacityType=SPOT`` (no taint).
* ``karpenter-spot``: Karpenter labels the nodes it launches
  ``karpenter.sh/capacity-type=spot`` (or ``on-demand``; no taint of its own).
* ``aks-spot``: AKS spot node pools label their nodes
  ``kubernetes.azure.com/scalesetpriority=spot`` and taint them
  ``kubernetes.azure.com/scalesetpriority=spot:NoSchedule``.
* ``acs``: Alibaba Cloud Container Compute Service GPU pods, chosen by the pod labels
  ``alibabacloud.com/compute-class: gpu`` and ``alibabacloud.com/gpu-model-series:
  <model>`` (ACS: "Specify GPU models and driver versions for ACS GPU-accelerated
  pods"; the model is the operator's, so the tier's profile must name it).
* ``acs-best-effort``: ``acs`` on ACS's preemptible capacity, the pod label
  ``alibabacloud.com/compute-qos: best-effort`` (ACS: "Overview of BestEffort
  computing": evicted with five minutes' notice).

The Kubernetes objects are rendered by :mod:`deploy.providers.kubernetes.render`;
this module imports pydantic only (``deploy.settings`` holds a ``profiles`` field).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BuiltinName = Literal[
    "gpu", "gke-spot", "eks-spot", "karpenter-spot", "aks-spot", "acs", "acs-best-effort"
]
GPU_RESOURCE = "nvidia.com/gpu"
ACS_CLASS, ACS_SERIES, ACS_QOS = (
    "alibabacloud.com/compute-class",
    "alibabacloud.com/gpu-model-series",
    "alibabacloud.com/compute-qos",
)
SPOT_NODE_LABELS: dict[str, str] = {
    "cloud.google.com/gke-spot": "true",
    "eks.amazonaws.com/capacityType": "SPOT",
    "karpenter.sh/capacity-type": "spot",
    "kubernetes.azure.com/scalesetpriority": "spot",
}
"""The node label (and value) by which each managed service marks its spot nodes."""
SPOT_POD_LABELS: dict[str, str] = {ACS_QOS: "best-effort"}
"""The pod label by which ACS (no nodes to select) puts a pod on preemptible capacity."""
RESERVED_LABEL_PREFIXES = ("framerelay/", "framerelay.io/", "app.kubernetes.io/")
"""Label keys a profile may not set: the orchestrator's own (it finds and selects its
pods by them) and the ones deploy/k8s's NetworkPolicies admit peers by."""

_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_DNS_SUBDOMAIN = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
_LABEL_KEY = re.compile(rf"^({_DNS_SUBDOMAIN}/)?{_NAME}$")
_LABEL_VALUE = re.compile(rf"^({_NAME})?$")
_RESOURCE = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$"
_DNS_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
_AFFINITY_KINDS = frozenset({"nodeAffinity", "podAffinity", "podAntiAffinity"})


def _label_key_problem(key: str) -> str | None:
    prefix, _, _ = key.rpartition("/")
    if not _LABEL_KEY.fullmatch(key) or len(prefix) > 253:
        return (
            f"{key!r} is no label key (an optional DNS prefix and '/', then 1-63 of A-Za-z0-9-_.)"
        )
    return None


def _check_labels(labels: dict[str, str], what: str) -> dict[str, str]:
    for key, value in labels.items():
        problem = _label_key_problem(key)
        if problem is not None:
            raise ValueError(f"{what}: {problem}")
        if not _LABEL_VALUE.fullmatch(value):
            raise ValueError(f"{what} {key}: {value!r} is no label value (0-63 of A-Za-z0-9-_.)")
    return labels


class Toleration(BaseModel):
    """A toleration, as Kubernetes writes it (``tolerationSeconds`` or
    ``toleration_seconds``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    key: str | None = Field(None, description="The taint's key; none with Exists: any taint.")
    operator: Literal["Exists", "Equal"] = "Equal"
    value: str | None = Field(None, description="With Equal: the taint's value.")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint's effect; none: every effect."
    )
    toleration_seconds: int | None = Field(
        None, alias="tolerationSeconds", ge=0, le=86_400 * 365, description="NoExecute only."
    )

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        problem = None if self.key is None else _label_key_problem(self.key)
        if problem is not None:
            raise ValueError(f"toleration: {problem}")
        if self.operator == "Exists" and self.value is not None:
            raise ValueError(f"toleration {self.key}: operator Exists takes no value")
        if self.operator == "Equal" and self.key is None:
            raise ValueError("toleration: operator Equal needs a key")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise ValueError(f"toleration {self.key}: tolerationSeconds goes with NoExecute")
        return self

    def manifest(self) -> dict[str, Any]:
        """The toleration in a Pod's ``spec.tolerations``."""
        out = {
            "key": self.key,
            "operator": self.operator,
            "value": self.value,
            "effect": self.effect,
            "tolerationSeconds": self.toleration_seconds,
        }
        return {k: v for k, v in out.items() if v is not None}


class TopologySpread(BaseModel):
    """Spread a tier's pods over the values of a node label (nodes, zones)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topology_key: str = Field(
        "kubernetes.io/hostname",
        description="kubernetes.io/hostname (nodes) or topology.kubernetes.io/zone (zones).",
    )
    max_skew: int = Field(1, ge=1, le=1000)
    when_unsatisfiable: Literal["ScheduleAnyway", "DoNotSchedule"] = Field(
        "ScheduleAnyway",
        description="ScheduleAnyway: a preference (a pod never stays Pending for it).",
    )

    @field_validator("topology_key")
    @classmethod
    def _key(cls, v: str) -> str:
        problem = _label_key_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v


class Share(BaseModel):
    """CPU (cores) and memory (GiB) of one GPU's worker: a pod of N GPUs gets N times."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cpu: float = Field(gt=0, le=512, description="Cores (0.5 = 500m).")
    memory_gib: float = Field(gt=0, le=8192, description="GiB (1.5 = 1536Mi).")


class SchedulingProfile(BaseModel):
    """Where and how a tier's worker pods run (docs/kubernetes.md#scheduling-profiles)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base: BuiltinName | None = Field(
        "gpu",
        description="The ready-made profile this one starts from (null: from nothing, "
        "not even the GPU taint's toleration).",
    )
    spot_nodes: bool | None = Field(
        None,
        description="Whether the pods land only on capacity the cluster takes back (spot); "
        "None: known from a spot node label in node_selector (GKE, EKS, Karpenter, AKS) "
        "or ACS's best-effort pod label.",
    )
    tolerations: tuple[Toleration, ...] = ()
    node_selector: dict[str, str] = Field(default_factory=dict)
    affinity: dict[str, Any] | None = Field(
        None,
        description="A Pod's spec.affinity as Kubernetes writes it (nodeAffinity, "
        "podAffinity, podAntiAffinity), put in the pod as given.",
    )
    runtime_class_name: str | None = Field(
        None, pattern=_DNS_NAME, description="e.g. nvidia, where the cluster has that class."
    )
    labels: dict[str, str] = Field(default_factory=dict, description="Extra pod labels.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Pod annotations.")
    image_pull_secrets: tuple[Annotated[str, Field(pattern=_DNS_NAME)], ...] = Field(
        (), description="Secrets (kubernetes.io/dockerconfigjson) of a private worker image."
    )
    topology_spread: tuple[TopologySpread, ...] = Field(
        (), description="Spread the tier's pods over nodes and/or zones."
    )
    gpu_resource: str = Field(
        GPU_RESOURCE,
        pattern=_RESOURCE,
        description="The extended resource of one GPU: nvidia.com/gpu, a MIG slice "
        "(nvidia.com/mig-1g.10gb), a time-sliced share (nvidia.com/gpu.shared).",
    )
    requests_per_gpu: Share = Field(Share(cpu=2, memory_gib=4))
    limits_per_gpu: Share = Field(Share(cpu=4, memory_gib=8))

    @field_validator("node_selector")
    @classmethod
    def _selector(cls, v: dict[str, str]) -> dict[str, str]:
        return _check_labels(v, "node_selector")

    @field_validator("labels")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        taken = [k for k in v if k.startswith(RESERVED_LABEL_PREFIXES)]
        if taken:
            raise ValueError(
                f"labels: {taken[0]!r} is the orchestrator's (keys under "
                f"{', '.join(RESERVED_LABEL_PREFIXES)} select its pods and admit network peers)"
            )
        return _check_labels(v, "labels")

    @field_validator("annotations")
    @classmethod
    def _annotations(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            problem = _label_key_problem(key)
            if problem is not None:
                raise ValueError(f"annotations: {problem}")
        return v

    @field_validator("affinity")
    @classmethod
    def _affinity(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(v or {}) - _AFFINITY_KINDS)
        if unknown:
            raise ValueError(
                f"affinity: {unknown[0]!r} is none of {', '.join(sorted(_AFFINITY_KINDS))}"
            )
        return v

    @property
    def selects_spot(self) -> bool:
        """Whether the pods land only on spot (interruptible) capacity."""
        if self.spot_nodes is not None:
            return self.spot_nodes
        return any(self.node_selector.get(k) == v for k, v in SPOT_NODE_LABELS.items()) or any(
            self.labels.get(k) == v for k, v in SPOT_POD_LABELS.items()
        )

    def over(self, start: SchedulingProfile) -> SchedulingProfile:
        """This profile's settings over ``start``'s: mappings merged (these win), lists
        added to (without repeats), the rest replaced; ``base`` gone."""
        update: dict[str, Any] = {"base": None}
        for name in self.model_fields_set - {"base"}:
            mine, theirs = getattr(self, name), getattr(start, name)
            if isinstance(mine, dict) and isinstance(theirs, dict) and name != "affinity":
                update[name] = {**theirs, **mine}
            elif isinstance(mine, tuple):
                update[name] = theirs + tuple(x for x in mine if x not in theirs)
            else:
                update[name] = mine
        return start.model_copy(update=update)

    def resolved(self) -> SchedulingProfile:
        """The profile a pod is rendered with: its base's settings under its own, checked
        as a whole (ValueError: what is wrong)."""
        out = self if self.base is None else self.over(BUILTIN_PROFILES[self.base])
        for field in ("cpu", "memory_gib"):
            if getattr(out.limits_per_gpu, field) < getattr(out.requests_per_gpu, field):
                raise ValueError(f"limits_per_gpu.{field} is below requests_per_gpu.{field}")
        if out.labels.get(ACS_CLASS) == "gpu" and not out.labels.get(ACS_SERIES):
            raise ValueError(
                f"ACS GPU pods need the label {ACS_SERIES} (the GPU model, e.g. T4): "
                f'add "labels": {{"{ACS_SERIES}": "<model>"}} to the profile'
            )
        return out


def _builtin(start: SchedulingProfile | None, **fields: Any) -> SchedulingProfile:
    mine = SchedulingProfile(base=None, **fields)
    return mine if start is None else mine.over(start)


_GPU = _builtin(
    None,
    tolerations=(Toleration(key=GPU_RESOURCE, operator="Exists", effect="NoSchedule"),),
    topology_spread=(TopologySpread(),),
)
_ACS = _builtin(_GPU, labels={ACS_CLASS: "gpu"})
BUILTIN_PROFILES: dict[str, SchedulingProfile] = {
    "gpu": _GPU,
    "gke-spot": _builtin(
        _GPU,
        node_selector={"cloud.google.com/gke-spot": "true"},
        tolerations=(
            Toleration(key="cloud.google.com/gke-spot", value="true", effect="NoSchedule"),
        ),
    ),
    "eks-spot": _builtin(_GPU, node_selector={"eks.amazonaws.com/capacityType": "SPOT"}),
    "karpenter-spot": _builtin(_GPU, node_selector={"karpenter.sh/capacity-type": "spot"}),
    "aks-spot": _builtin(
        _GPU,
        node_selector={"kubernetes.azure.com/scalesetpriority": "spot"},
        tolerations=(
            Toleration(
                key="kubernetes.azure.com/scalesetpriority", value="spot", effect="NoSchedule"
            ),
        ),
    ),
    "acs": _ACS,
    "acs-best-effort": _builtin(_ACS, labels={ACS_QOS: "best-effort"}),
}
"""The ready-made profiles, each whole (no ``base``); the module docstring cites each."""
SPOT_PROFILES = tuple(name for name, p in BUILTIN_PROFILES.items() if p.selects_spot)


class HasProfiles(Protocol):
    """What :func:`profile_for` reads of the provider's settings."""

    @property
    def profiles(self) -> Mapping[str, SchedulingProfile]: ...

    @property
    def node_selector(self) -> Mapping[str, str]: ...


def profile_for(settings: HasProfiles, tier: str) -> SchedulingProfile:
    """The resolved profile of a tier's pods: its own (``gpu`` when it has none), over the
    deprecated one-for-all ``node_selector`` (ValueError: a bad profile)."""
    resolved = (settings.profiles.get(tier) or SchedulingProfile()).resolved()
    if not settings.node_selector:
        return resolved
    selector = {**settings.node_selector, **resolved.node_selector}
    return resolved.model_copy(update={"node_selector": selector})
