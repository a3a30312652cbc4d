"""The ``runpod`` provider: GPU pods rented through RunPod's REST API v2
(``https://api.runpod.io/v2``; v1 was retired on 2026-11-15 and its URL is refused
at start).

Modules, each one concept:

* :mod:`~deploy.providers.runpod.client`: the HTTP client: the API key in the
  ``Authorization`` header only, retries of 429/5xx with backoff, RFC 9457 problems
  turned into one actionable line, wrapped lists read page by page;
* :mod:`~deploy.providers.runpod.catalog`: ``GET /v2/catalog/gpus`` (stock, CUDA
  versions, list prices per cloud), cached briefly, and the rule that orders a
  create's candidates: cheapest GPU type with stock that fits the VRAM need, in the
  clouds the tier allows;
* :mod:`~deploy.providers.runpod.pods`: the create body and what a pod's JSON says
  (status, cost, the address from ``runtime.ports``, unreachable or not);
* :mod:`~deploy.providers.runpod.provider`: :class:`RunPodProvider`, the
  :class:`deploy.providers.base.Provider` of it all: idempotent create, get, list,
  the lifecycle through ``POST /v2/pods/{id}/action``, unreachable pods failed fast.

May import :mod:`deploy.models`, :mod:`deploy.settings`, :mod:`deploy.providers.base`
and :mod:`framerelay`; nothing of the fleet.
"""
