"""framerelay.listeners without sockets: the connection counting, the settings, the
uvicorn options. The listeners themselves: tests/security/test_listeners.py."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from framerelay.listeners import ConnectionLimiter, ListenerSettings, answer, uvicorn_options

ENV = "FRAMERELAY_TEST_LISTENER"


def _limiter(**settings: object) -> ConnectionLimiter:
    return ConnectionLimiter(ListenerSettings.model_validate(settings), ENV)


def test_defaults() -> None:
    s = ListenerSettings()
    assert (s.max_connections, s.max_connections_per_peer) == (2000, 100)
    assert (s.header_timeout_s, s.keep_alive_s, s.trusted_proxies) == (10.0, 5.0, ())


def test_per_address_cap_then_release() -> None:
    lim = _limiter(max_connections_per_peer=2)
    assert [lim.admit("10.0.0.1") for _ in range(2)] == [None, None]
    refusal = lim.admit("10.0.0.1")
    assert refusal is not None and f"{ENV}__MAX_CONNECTIONS_PER_PEER" in refusal
    assert lim.admit("10.0.0.2") is None  # another address
    lim.release("10.0.0.1")
    assert lim.admit("10.0.0.1") is None
    assert lim.open == 3 and lim.refused == {"per_peer": 1}


def test_total_cap_and_trusted_proxies_exempt_from_the_per_address_cap() -> None:
    lim = _limiter(max_connections=5, max_connections_per_peer=1, trusted_proxies="10.1.0.0/16")
    assert [lim.admit("10.1.2.3") for _ in range(4)] == [None] * 4  # a trusted proxy
    assert lim.admit("10.0.0.1") is None
    refusal = lim.admit("10.0.0.9")
    assert refusal is not None and f"{ENV}__MAX_CONNECTIONS)" in refusal
    for _ in range(4):
        lim.release("10.1.2.3")
    lim.release("10.0.0.1")
    assert lim.open == 0 and lim.open_from("10.1.2.3") == 0


def test_no_per_address_cap_when_zero() -> None:
    lim = _limiter(max_connections_per_peer=0, max_connections=100)
    assert all(lim.admit("10.0.0.1") is None for _ in range(100))


@pytest.mark.parametrize(
    ("given", "networks"),
    [
        ("10.0.0.0/8", ("10.0.0.0/8",)),
        ("10.0.0.0/8, 192.168.1.5", ("10.0.0.0/8", "192.168.1.5/32")),
        ('["::1", "fd00::/8"]', ("::1/128", "fd00::/8")),
        ("", ()),
        (["10.0.0.1"], ("10.0.0.1/32",)),
    ],
)
def test_trusted_proxies_parse(given: object, networks: tuple[str, ...]) -> None:
    assert ListenerSettings.model_validate({"trusted_proxies": given}).trusted_proxies == networks


@pytest.mark.parametrize("given", ["*", "10.0.0.0/33", "proxy.local", '["10.0.0.1"'])
def test_trusted_proxies_refuse_what_is_no_network(given: str) -> None:
    with pytest.raises(ValidationError, match=r"CIDR|JSON list"):
        ListenerSettings.model_validate({"trusted_proxies": given})


def test_uvicorn_believes_forwarded_addresses_only_from_trusted_proxies() -> None:
    plain = uvicorn_options(_limiter())
    assert plain["proxy_headers"] is False  # uvicorn alone trusts 127.0.0.1
    proxied = uvicorn_options(_limiter(trusted_proxies="10.1.0.0/16", keep_alive_s=2))
    assert proxied["proxy_headers"] is True and proxied["forwarded_allow_ips"] == ["10.1.0.0/16"]
    assert proxied["timeout_keep_alive"] == 2.0


def test_answer_is_a_whole_closing_response() -> None:
    raw = answer(503, "full")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"connection: close" in head and b"retry-after: 1" in head
    assert body == b"full\n" and f"content-length: {len(body)}".encode() in head
