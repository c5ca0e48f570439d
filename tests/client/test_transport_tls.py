"""``https://`` controllers: the socket transport wraps TLS with the stdlib's checks.

A self-signed certificate for 127.0.0.1 serves a stub over TLS. Trusted (through
``SSL_CERT_FILE``, which OpenSSL's default verify paths read), requests succeed on one
kept-alive connection; untrusted, the certificate check fails the request as a
transport error naming it, as ``http.client`` did.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from resource_controller import errors
from resource_controller.client import aio_transport, transport
from resource_controller.client.calls import Call

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def self_signed(tmp: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = tmp / "cert.pem", tmp / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture
def tls_stub(tmp_path: Path) -> Iterator[tuple[str, Path, list[Any]]]:
    cert_file, key_file = self_signed(tmp_path)
    peers: list[Any] = []

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            peers.append(self.client_address)
            body = json.dumps({"path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02})
    thread.daemon = True
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}", cert_file, peers
    finally:
        server.shutdown()
        server.server_close()


def test_a_trusted_certificate_serves_requests_on_one_connection(
    tls_stub: tuple[str, Path, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, cert_file, peers = tls_stub
    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    t = transport.Transport(url, "t")
    assert t.request(Call("GET", "/v1/state")) == {"path": "/v1/state"}
    assert t.request(Call("GET", "/v1/whoami")) == {"path": "/v1/whoami"}
    assert len(set(peers)) == 1


def test_an_untrusted_certificate_fails_the_request(
    tls_stub: tuple[str, Path, list[Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    url, _cert, peers = tls_stub
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-bundle.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    with pytest.raises(errors.TransportError) as info:
        transport.Transport(url, "t").request(Call("GET", "/v1/state"))
    assert str(info.value).startswith(f"GET {url}/v1/state: ")
    assert "certificate verify failed" in str(info.value)
    assert peers == []


def test_the_asyncio_shell_checks_the_certificate_the_same_way(
    tls_stub: tuple[str, Path, list[Any]], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The asynchronous client, the worker and webhooks: TLS through ``ssl`` too."""
    url, cert_file, peers = tls_stub

    async def get() -> Any:
        t = aio_transport.AsyncTransport(url, "t")
        try:
            return await t.request(Call("GET", "/v1/state", timeout=10))
        finally:
            await t.aclose()

    monkeypatch.setenv("SSL_CERT_FILE", str(cert_file))
    assert asyncio.run(get()) == {"path": "/v1/state"}
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "no-such-bundle.pem"))
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path))
    with pytest.raises(errors.ConnectFailed, match="certificate verify failed"):
        asyncio.run(get())
    assert len(peers) == 1
