"""No token in any log line, stored byte or URL (EXT-METRICS-2, AUTH-004, the house rules).

A short real session (rc serve, rc worker, rc run / hold / release / kill / drain and a
refused call) runs with distinctive tokens, in text and in ``--log-format json`` (the
processes have no debug level to turn up). Every byte the controller and the worker
wrote to stdout and stderr, every client's output, and every file under the data and
state directories is then searched for each token, raw and in its obvious encodings.
All traffic, the worker's and the clients', goes through a recording proxy on
loopback, so the test also sees every request line: a token may ride only in an
``Authorization`` header, never in a URL.
"""

from __future__ import annotations

import base64
import contextlib
import re
import socket
import threading
import time
from urllib.parse import quote, quote_plus

import pytest

from .cluster import Cluster, stop, wait_for

WORKER_TOKEN = "wtok-Q7hygieneW3b1c"
CLIENT_TOKEN = "ctok-Z9hygieneK2d4f"
ADMIN_TOKEN = "atok-X5hygieneM8e6a"
WRONG_TOKEN = "nope-J4hygieneR1t0z"
TOKENS = (WORKER_TOKEN, CLIENT_TOKEN, ADMIN_TOKEN, WRONG_TOKEN)


class RecordingProxy:
    """A loopback TCP relay that keeps every byte sent towards the controller."""

    def __init__(self, target_port: int) -> None:
        self.target = ("127.0.0.1", target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.lock = threading.Lock()
        self.upstream: list[bytearray] = []
        self.stopping = False
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopping:
            try:
                down, _ = self.listener.accept()
            except OSError:
                return
            try:
                up = socket.create_connection(self.target, timeout=10)
            except OSError:
                down.close()
                continue
            up.settimeout(None)
            buf = bytearray()
            with self.lock:
                self.upstream.append(buf)
            threading.Thread(target=self._pump, args=(down, up, buf), daemon=True).start()
            threading.Thread(target=self._pump, args=(up, down, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, record: bytearray | None) -> None:
        try:
            while data := src.recv(65536):
                if record is not None:
                    with self.lock:
                        record += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            src.close()  # each socket is the source of exactly one pump

    def recorded(self) -> list[bytes]:
        with self.lock:
            return [bytes(b) for b in self.upstream]

    def stop(self) -> None:
        self.stopping = True
        self.listener.close()


def encodings(token: str) -> dict[str, bytes]:
    """The token as it could appear if something wrote it out: raw, URL, base64, hex."""
    raw = token.encode()
    found = {
        "raw": raw,
        "url": quote(token, safe="").encode(),
        "url+": quote_plus(token).encode(),
        "hex": raw.hex().encode(),
        "basic": base64.b64encode(f"x:{token}".encode())[4:-4],
    }
    # base64 of the token anywhere in a longer text: three alignments, edges trimmed.
    for k in range(3):
        enc = base64.b64encode(b"\0" * k + raw)
        found[f"base64/{k}"] = enc[4 if k else 0 : -4]
        found[f"base64url/{k}"] = base64.urlsafe_b64encode(b"\0" * k + raw)[4 if k else 0 : -4]
    return found


def scan(blobs: dict[str, bytes]) -> list[str]:
    hits = []
    for where, blob in blobs.items():
        for token in TOKENS:
            for how, needle in encodings(token).items():
                if needle in blob:
                    hits.append(f"{token} ({how}) in {where}")
    return hits


REQUEST_LINE = re.compile(rb"(?m)^(GET|POST|PUT|DELETE|PATCH|HEAD|OPTIONS) (\S+) HTTP/1\.[01]\r$")


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_no_token_in_logs_state_or_urls(cluster: Cluster, log_format: str) -> None:
    tokens = f"{WORKER_TOKEN}:worker,{CLIENT_TOKEN}:client,{ADMIN_TOKEN}:admin:ops"
    cluster.start_controller(
        "--log-format",
        log_format,
        # "ctok" is the token the cluster helpers poll with while waiting.
        tokens=f"{tokens},ctok:client",
    )
    proxy = RecordingProxy(cluster.port)
    try:
        cluster.port = proxy.port  # from here on, every request goes through the proxy
        cluster.start_worker(
            "box", ["gpu0", "gpu1"], token=WORKER_TOKEN, args=("--log-format", log_format)
        )
        outputs = session(cluster)
        # Stopped first, so what they write on the way out is read as well.
        for proc in reversed(cluster.procs):
            stop(proc)
    finally:
        proxy.stop()

    blobs: dict[str, bytes] = {f"client output {i}": o.encode() for i, o in enumerate(outputs)}
    for path in sorted(cluster.tmp.rglob("*")):
        if path.is_file() and not path.name.endswith(".yaml"):
            blobs[str(path.relative_to(cluster.tmp))] = path.read_bytes()
    assert any(k.startswith("data/") for k in blobs), sorted(blobs)
    assert any(k.startswith("state-box/") for k in blobs), sorted(blobs)
    assert blobs["controller.log"] and blobs["worker-box.log"]
    hits = scan(blobs)
    assert not hits, "\n".join(hits)

    # Every request line, the worker's and the clients': no token in any URL.
    streams = proxy.recorded()
    lines = [m.group(2) for s in streams for m in REQUEST_LINE.finditer(s)]
    assert len(lines) > 20, lines
    assert any(b"/v1/workers/register" in u for u in lines)
    assert any(u.startswith(b"/v1/jobs") for u in lines)
    url_hits = scan({f"request line {u[:120]!r}": u for u in lines})
    assert not url_hits, "\n".join(url_hits)
    # ...and it did travel, in the header: the scan would have seen it in the bytes.
    sent = b"".join(streams)
    for token in (WORKER_TOKEN, CLIENT_TOKEN, ADMIN_TOKEN):
        assert f"Authorization: Bearer {token}".encode().lower() in sent.lower(), token


def session(cluster: Cluster) -> list[str]:
    """rc run (ok, failing, printing its env), hold + release, kill, drain, a refusal."""
    outputs: list[str] = []

    def rc(*args: str, token: str = CLIENT_TOKEN, code: int | None = 0) -> str:
        r = cluster.rc(*args, token=token)
        outputs.extend([r.stdout, r.stderr])
        if code is not None:
            assert r.returncode == code, (args, r.returncode, r.stderr, cluster.logs())
        return r.stdout

    assert "hello" in rc("run", "--", "sh", "-c", "echo hello")
    rc("run", "--", "sh", "-c", "echo bye >&2; exit 3", code=3)
    # The job's own environment is stored as its output: no token may be in it.
    rc("run", "--here", "--", "env")
    rc("run", "--", "env")
    rc("whoami")
    rc("whoami", token=ADMIN_TOKEN)
    rc("run", "--", "true", token=WRONG_TOKEN, code=None)

    hold = cluster.popen_rc(
        "hold", "box:gpu1", "--ttl", "5m", "--reason", "hygiene", token=CLIENT_TOKEN
    )

    def held() -> str | None:
        _, state = cluster.api("GET", "/v1/state", token=CLIENT_TOKEN)
        for job in state["jobs"]:
            if job["kind"] == "hold" and job["state"] == "running":
                return str(job["id"])
        return None

    hold_id = wait_for(held, 30, "the hold to be granted")
    rc("release", hold_id)
    out, err = hold.communicate(timeout=30)
    outputs.extend([out, err])

    runner = cluster.popen_rc("run", "-d", "box:gpu0", "--", "sleep", "60", token=CLIENT_TOKEN)

    def running() -> str | None:
        _, state = cluster.api("GET", "/v1/state", token=CLIENT_TOKEN)
        for job in state["jobs"]:
            if job["kind"] == "job" and job["state"] == "running":
                return str(job["id"])
        return None

    job_id = wait_for(running, 30, "the sleep to run")
    rc("logs", job_id)
    rc("kill", job_id)
    out, err = runner.communicate(timeout=30)
    outputs.extend([out, err])
    cluster.wait_job(job_id, lambda j: j["state"] in ("killed", "failed", "exited"))

    rc("drain", "box:gpu1", "--reason", "hygiene", token=ADMIN_TOKEN)
    rc("undrain", "box:gpu1", token=ADMIN_TOKEN)
    rc("devices")
    rc("jobs")
    time.sleep(1.5)  # a heartbeat or two through the proxy, with the worker's token
    return outputs
