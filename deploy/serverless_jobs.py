"""Jobs on serverless tiers (issue 18, serverless mode): the orchestrator's side.

A serverless tier is a RunPod serverless endpoint: batch capacity that RunPod scales
from zero and back by itself, billed by the second of execution. Either the
orchestrator manages it (the tier's ``serverless`` settings: created or updated as
``<fleet>-<tier>`` by :mod:`deploy.providers.runpod.endpoints`, whose answer gives the
endpoint's id and request URLs) or it was made by hand (``serverless_endpoint_id``).
The orchestrator rents no pod for it (:attr:`deploy.settings.TierConfig.rents_pods`):
the scaler plans nothing there and placement has no worker of it.

**Which jobs.** :func:`choose` decides once, when a job is submitted, and the job's
record keeps the choice (:class:`ServerlessChoice`): a job with ``serverless`` null
(the default) runs on the cheapest serverless tier its priority allows (a batch job: any;
a standard job: one that is not ``batch_only``), when there is one, else on pods as
before; ``true`` requires one (the submission is refused without); ``false`` keeps the
job on pods.

**How a task reaches the ingest.** Its stream spec carries the endpoint
(``job.serverless_endpoint_id``, and for a managed one ``job.serverless_urls``);
placement leaves it out (:func:`deploy.jobs.placement_view`) and the fleet gives the
ingest its definition with ``POST /v1/streams``
(:meth:`deploy.ingest_link.IngestLink.serve`), taken back with
``DELETE /v1/streams/{id}``: the ingest's hook (``ingest.serverless_task``) serves such
a stream from the endpoint and never opens a tunnel. The ingest stores the definition,
so a restarted ingest resumes the task from its checkpoint. The fleet remembers such a
stream as acknowledged on :data:`SERVERLESS` (not a worker).

**Cost.** The ingest adds up the executionTime RunPod reports for the task's jobs
(``TaskProgress.execution_s``); the job is charged that many seconds at the tier's
``serverless_price_per_s`` (:func:`charge_execution`), and no share of any pod.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from deploy.ingest_link import IngestLink
from deploy.models import StreamSpec
from deploy.settings import OrchestratorSettings, TierConfig
from framerelay.jobs import EndpointUrls, JobSpec, TaskProgress

SERVERLESS = "@serverless"
"""Where the fleet records a stream the ingest serves from an endpoint (no worker has
this name: pod and worker names are lowercase letters, digits and '-')."""


class NoServerlessTier(ValueError):
    """A job asked for a serverless tier (``serverless`` true) and none allows it."""


class Reconciled(Protocol):
    """A managed tier's endpoint as RunPod answered for it
    (:class:`deploy.providers.runpod.endpoints.ManagedEndpoint`)."""

    @property
    def id(self) -> str: ...

    @property
    def urls(self) -> EndpointUrls: ...


class ServerlessChoice(BaseModel):
    """The serverless tier a job runs on, as chosen at submission."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    tier: str
    endpoint_id: str
    price_per_s: float = Field(0.0, ge=0)
    urls: EndpointUrls | None = Field(
        None,
        description="A managed endpoint's request URLs (RunPod's answer); None: "
        "one made by hand, reached at the ingest's base URL and its id.",
    )


def serverless_tiers(settings: OrchestratorSettings, spec: JobSpec) -> list[TierConfig]:
    """The serverless tiers ``spec``'s priority allows, cheapest a second first (ties: the
    order they are listed in)."""
    ok = [t for t in settings.tiers if not t.rents_pods
          and (spec.priority == "batch" or not t.batch_only)]  # fmt: skip
    return sorted(ok, key=lambda t: t.serverless_price_per_s)


def choose(
    settings: OrchestratorSettings,
    spec: JobSpec,
    endpoints: Mapping[str, Reconciled] | None = None,
) -> ServerlessChoice | None:
    """Where ``spec`` runs: a serverless tier, or None for pods. ``endpoints``: the managed
    tiers' endpoints ready now (tier name -> endpoint); a managed tier without one takes
    no job. NoServerlessTier when the job requires a serverless tier and none takes it."""
    if spec.serverless is False:
        return None
    ready = endpoints or {}
    allowed = serverless_tiers(settings, spec)
    tiers = [t for t in allowed if t.serverless is None or t.name in ready]
    if not tiers:
        if spec.serverless:
            raise NoServerlessTier(_why_none(spec, allowed))
        return None
    tier = tiers[0]
    managed = ready.get(tier.name) if tier.serverless is not None else None
    if managed is not None:
        return ServerlessChoice(
            tier=tier.name,
            endpoint_id=managed.id,
            urls=managed.urls,
            price_per_s=tier.serverless_price_per_s,
        )
    assert tier.serverless_endpoint_id is not None  # noqa: S101 - serverless_tiers' filter
    return ServerlessChoice(
        tier=tier.name,
        endpoint_id=tier.serverless_endpoint_id,
        price_per_s=tier.serverless_price_per_s,
    )


def _why_none(spec: JobSpec, allowed: Sequence[TierConfig]) -> str:
    if allowed:  # managed tiers, none of them with its endpoint yet
        return (
            f"tier {allowed[0].name}'s serverless endpoint is not ready: the orchestrator "
            "makes it at start (its log says why it could not); try again shortly"
        )
    return (
        f"no serverless tier takes a {spec.priority} job: give a tier serverless settings "
        "or a serverless_endpoint_id (a batch_only one takes batch jobs only)"
    )


def endpoint_of(spec: StreamSpec) -> str | None:
    """The serverless endpoint that serves ``spec`` (a job task on a serverless tier)."""
    return None if spec.job is None else spec.job.serverless_endpoint_id


def pod_streams(streams: Sequence[StreamSpec]) -> list[StreamSpec]:
    """The streams that need a worker of a pod (not those served from an endpoint)."""
    return [s for s in streams if endpoint_of(s) is None]


def batch_pinned(settings: OrchestratorSettings) -> bool:
    """Batch streams run only on batch-only tiers: there is a batch-only tier of pods."""
    return any(t.batch_only and t.rents_pods for t in settings.tiers)


async def withdraw(link: IngestLink, stream_id: str, where: str | None) -> bool:
    """Take a stream off the ingest, as it was given (``where``: :data:`SERVERLESS`, a
    worker, or None); True once done."""
    if where == SERVERLESS:
        return await link.unserve(stream_id)
    return await link.unassign(stream_id)


def execution_s(progress: Sequence[TaskProgress | None], before: Sequence[float]) -> list[float]:
    """Each task's billed execution seconds: what its ingest says, never less than known."""
    said = [p.execution_s if p is not None and p.execution_s is not None else 0.0
            for p in progress]  # fmt: skip
    return [max(a, b) for a, b in zip(said, before, strict=True)]
