"""A one-shot TLS server on 127.0.0.1 presenting a given certificate, and the client side of
a handshake with it as the ingest makes it (the orchestrator's CA, the pod's name)."""

from __future__ import annotations

import socket
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from cryptography import x509


@contextmanager
def tls_server(cert_pem: str, key_pem: str, folder: Path) -> Iterator[int]:
    """A TLS server on 127.0.0.1 presenting ``cert_pem``; yields its port."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "c.pem").write_text(cert_pem)
    (folder / "k.pem").write_text(key_pem)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(folder / "c.pem", folder / "k.pem")
    srv = socket.create_server(("127.0.0.1", 0))
    srv.settimeout(0.2)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = srv.accept()
            except TimeoutError:
                continue
            try:
                with ctx.wrap_socket(conn, server_side=True) as tls:
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield int(srv.getsockname()[1])
    finally:
        done.set()
        thread.join(5)
        srv.close()


def handshake(port: int, ca_file: Path, server_hostname: str) -> x509.Certificate:
    """Connect as the ingest does: the orchestrator's CA, the pod's name."""
    ctx = ssl.create_default_context(cafile=str(ca_file))
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    with socket.create_connection(("127.0.0.1", port), 5) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
            der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def sans(cert: x509.Certificate) -> tuple[list[str], list[str]]:
    ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    ips = [str(ip) for ip in ext.get_values_for_type(x509.IPAddress)]
    return ext.get_values_for_type(x509.DNSName), ips
