"""Test support shared by the test folders (and only test support: no test here).

Waiting (``waiting``: the one bounded polling helper, sync and async), ports and real
servers (``servers``: ``free_port``, RTSP/RTMP/HTTP/Redis), media made with ffmpeg,
tokens and key sets (``auth``), standalone ingest streams (``harness``), an in-process
worker and a tunnel client streaming to it (``worker_harness``), the frozen v1 tunnel
peer (``wire_v1_peer``), recordings (``clip_rig``), ``promtool``, the RunPod and
Kubernetes stand-ins (``runpod``, ``k8s_api``), a browser; an orchestrator's settings and
an app served on loopback (``orchestrator``), a real ingest API in the test's event loop
and a private PKI (``ingest_api``), a whole local fleet (``fleet``), the results hub on a
loopback socket and a live camera with its recorder (``results_hub``), an orchestrator on the
RunPod contract server with a fake clock (``contract_fleet``), a TLS handshake with a
one-shot server (``tls_handshake``), worker processes and an ingest over ASGI for failover
tests (``failover``), the ingest over ASGI on a given store (``asgi_ingest``), a scripted
source for the reconnect loop (``scripted_source``), the console tests' orchestrators and
sign-in (``console``), detector inputs and a same-detections check (``detector_io``),
``framerelay ingest``/``orchestrator`` as processes (``service_processes``).
A helper two test folders need lives here, not in one of them, and so does anything two
test modules share: no test module imports another.
"""
