"""``RC_TOKENS`` parsing and the ``rc serve`` process: start-up errors, bind failure, SIGTERM.

The process is started as ``serve.run(ADDR, DATA, False)`` in a subprocess: that is the
whole of ``rc serve`` behind its flag parsing (SRV-001 flags are the CLI's concern).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from resource_controller.controller.auth import TokenError, parse_tokens
from resource_controller.core.identity import Caller
from resource_controller.core.states import Role

EXAMPLE = "RC_TOKENS required, e.g. RC_TOKENS='wtok:worker,ctok:client,atok:admin'"

# ---- SRV-004/005/006: parse_tokens ------------------------------------------------------


def test_valid_tokens_parse_to_roles() -> None:
    # SRV-004: the documented example; no name (EXT-WHO-1: exactly as the base).
    assert parse_tokens("wtok:worker,ctok:client,atok:admin") == {
        "wtok": Caller(Role.WORKER),
        "ctok": Caller(Role.CLIENT),
        "atok": Caller(Role.ADMIN),
    }


def test_entries_are_trimmed_but_nothing_inside_them_is() -> None:
    # SRV-005 step 1: leading/trailing whitespace of an entry goes; inner text stays.
    assert parse_tokens("  a b:worker ,\tc:client\n") == {
        "a b": Caller(Role.WORKER),
        "c": Caller(Role.CLIENT),
    }


def test_role_is_the_text_between_the_first_and_second_colon() -> None:
    # EXT-WHO-1 (changing SRV-005 step 4): "t:worker:x" is token "t", role "worker", name "x".
    assert parse_tokens("t:worker:x") == {"t": Caller(Role.WORKER, "x")}


def test_named_tokens() -> None:
    # EXT-WHO-1: every character of the charset, 1 and 64 long, beside unnamed entries.
    full = "AZaz09._@/-"
    value = f"w:worker:box-1, c:client:{full} ,a:admin:{'n' * 64},p:client,q:client:a"
    assert parse_tokens(value) == {
        "w": Caller(Role.WORKER, "box-1"),
        "c": Caller(Role.CLIENT, full),
        "a": Caller(Role.ADMIN, "n" * 64),
        "p": Caller(Role.CLIENT),
        "q": Caller(Role.CLIENT, "a"),
    }


def _name_error(name: str, role: str = "client") -> str:
    return (
        f'malformed name "{name}" for a {role} token in RC_TOKENS'
        " (1-64 characters of A-Z a-z 0-9 . _ @ / -)"
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("t:client:", _name_error("")),  # empty
        ("t:client:" + "n" * 65, _name_error("n" * 65)),  # too long
        ("t:client:a:b", _name_error("a:b")),  # a third colon is in the name
        ("t:client:al ice", _name_error("al ice")),  # inner space
        ("t:client: alice", _name_error(" alice")),  # nothing inside an entry is trimmed
        ("t:client:al\tice", _name_error("al\tice")),
        ("t:worker:box+1", _name_error("box+1", "worker")),
        ("t:admin:root!", _name_error("root!", "admin")),
        ("t:client:al,ice", 'malformed RC_TOKENS entry "ice"'),  # the comma splits first
        ("t:client:äl", _name_error("äl")),  # ASCII only
        ("t:client:a*", _name_error("a*")),
        ("t:client:~a", _name_error("~a")),
        ("t:client:a=b", _name_error("a=b")),
        # The role is checked before the name, the name before duplicates.
        ("t:Client:alice", 'unknown role "Client" in RC_TOKENS'),
        ("t::alice", 'unknown role "" in RC_TOKENS'),
        ("t:client:a,t:client:b b", _name_error("b b")),
        ("t:client:a,t:admin:b", 'duplicate token "t" in RC_TOKENS'),
        ("t:client,t:client:a", 'duplicate token "t" in RC_TOKENS'),
    ],
)
def test_malformed_names(value: str, message: str) -> None:
    # EXT-WHO-1: a malformed name is a start-up error like the others (SRV-006); the
    # message names the name and the role, never the token.
    with pytest.raises(TokenError) as e:
        parse_tokens(value)
    assert str(e.value) == message


def test_a_bad_name_never_shows_the_token() -> None:
    # EXT-WHO-1 / SRV-006: tokens are never logged, and stderr is often a log.
    with pytest.raises(TokenError) as e:
        parse_tokens("s3cret-tok:client:bad name")
    assert "s3cret" not in str(e.value)


@pytest.mark.parametrize("value", [None, ""])
def test_unset_or_empty(value: str | None) -> None:
    # SRV-006: unset or empty.
    with pytest.raises(TokenError) as e:
        parse_tokens(value)
    assert str(e.value) == EXAMPLE


@pytest.mark.parametrize(
    ("value", "message"),
    [
        # SRV-005 step 2: no colon, including the empty entries of stray commas.
        ("nocolon", 'malformed RC_TOKENS entry "nocolon"'),
        ("  nocolon  ", 'malformed RC_TOKENS entry "nocolon"'),
        ("a:worker,", 'malformed RC_TOKENS entry ""'),
        ("a:worker,,b:client", 'malformed RC_TOKENS entry ""'),
        (",a:worker", 'malformed RC_TOKENS entry ""'),
        ("   ", 'malformed RC_TOKENS entry ""'),
        # step 3: empty token.
        (":worker", 'empty token in RC_TOKENS entry ":worker"'),
        ("a:worker, :admin", 'empty token in RC_TOKENS entry ":admin"'),
        # step 4: anything but the three case-sensitive role words.
        ("t:Worker", 'unknown role "Worker" in RC_TOKENS'),
        ("t:", 'unknown role "" in RC_TOKENS'),
        ("t:ad min", 'unknown role "ad min" in RC_TOKENS'),
        ("t: admin", 'unknown role " admin" in RC_TOKENS'),
        ("t:root", 'unknown role "root" in RC_TOKENS'),
        # step 5: a repeated token, even with the same role.
        ("a:worker,a:worker", 'duplicate token "a" in RC_TOKENS'),
        ("a:worker,b:client,a:admin", 'duplicate token "a" in RC_TOKENS'),
        # Entry by entry, in order: the first bad entry decides the message.
        ("t:bogus,nocolon", 'unknown role "bogus" in RC_TOKENS'),
        ("nocolon,t:bogus", 'malformed RC_TOKENS entry "nocolon"'),
        ("a:worker,a:client,:x", 'duplicate token "a" in RC_TOKENS'),
    ],
)
def test_token_errors(value: str, message: str) -> None:
    # SRV-005 / SRV-006: the exact message shapes.
    with pytest.raises(TokenError) as e:
        parse_tokens(value)
    assert str(e.value) == message


# ---- the process ------------------------------------------------------------------------

SERVE = (
    "import sys; from pathlib import Path; from resource_controller.controller import serve; "
    "sys.exit(serve.run(sys.argv[1], Path(sys.argv[2]), False))"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(addr: str, data: Path, tokens: str | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RC_TOKENS", "RC_WEBHOOK_URL")}
    if tokens is not None:
        env["RC_TOKENS"] = tokens
    return subprocess.Popen(
        [sys.executable, "-c", SERVE, addr, str(data)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"rc serve did not exit within {timeout} s")
    return proc.returncode, err


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (None, EXAMPLE),
        ("", EXAMPLE),
        ("a:worker,,b:client", 'malformed RC_TOKENS entry ""'),
        ("a:superuser", 'unknown role "superuser" in RC_TOKENS'),
        ("a:worker,a:admin", 'duplicate token "a" in RC_TOKENS'),
        # EXT-WHO-1: a malformed name, like any other bad entry.
        ("a:worker,b:client:al ice", _name_error("al ice")),
    ],
)
@pytest.mark.e2e
def test_bad_tokens_exit_1_with_one_line_before_touching_data(
    tmp_path: Path, tokens: str | None, message: str
) -> None:
    # SRV-006 / SRV-020: tokens are checked first; one "rc: " line; no data dir, no socket.
    data = tmp_path / "deep" / "data"
    port = free_port()
    code, err = finish(spawn(f"127.0.0.1:{port}", data, tokens), timeout=20)
    assert code == 1
    assert err.splitlines() == [f"rc: {message}"]
    assert not data.exists()
    assert not (tmp_path / "deep").exists()


@pytest.mark.e2e
def test_data_dir_layout(tmp_path: Path) -> None:
    # SRV-010: the data directory and logs/ are created, parents included; owner only
    # (0700, not SRV-010's 0755: job logs and the database hold what jobs print and run).
    data = tmp_path / "a" / "b"
    port = free_port()
    proc = spawn(f"127.0.0.1:{port}", data, "wtok:worker,ctok:client,atok:admin")
    try:
        wait_listening(proc, port)
        assert (data / "rc.db").is_file()
        assert (data / "logs").is_dir()
        assert (data.stat().st_mode & 0o777) == 0o700
        assert ((data / "logs").stat().st_mode & 0o777) == 0o700
        assert ((data / "rc.db").stat().st_mode & 0o777) == 0o600
    finally:
        proc.send_signal(signal.SIGTERM)
        finish(proc, timeout=15)


@pytest.mark.e2e
def test_port_in_use_exits_1_promptly(tmp_path: Path) -> None:
    # SRV-021: a bind failure exits 1 at once with the error on stderr, never hangs.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        started = time.monotonic()
        code, err = finish(
            spawn(f"127.0.0.1:{port}", tmp_path / "data", "wtok:worker,ctok:client,atok:admin"),
            timeout=20,
        )
        elapsed = time.monotonic() - started
    assert code == 1
    lines = [ln for ln in err.splitlines() if ln.startswith("rc: ")]
    assert len(lines) == 1, err
    assert str(port) in lines[0]
    assert elapsed < 10


def wait_listening(proc: subprocess.Popen[str], port: int) -> None:
    """Until an unauthenticated GET /v1/state answers 401 (the AUTH-031 liveness check)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"rc serve exited early: {proc.communicate()}")
        try:
            r = httpx.get(f"http://127.0.0.1:{port}/v1/state", timeout=1)
        except httpx.TransportError:
            time.sleep(0.05)
            continue
        assert r.status_code == 401
        return
    pytest.fail("rc serve did not start listening")


@pytest.mark.e2e
def test_sigterm_exits_0_promptly_even_with_a_long_poll_waiting(tmp_path: Path) -> None:
    # SRV-050: SIGTERM stops the server; a waiting long poll does not hold it up to 30 s.
    port = free_port()
    proc = spawn(f"127.0.0.1:{port}", tmp_path / "data", "wtok:worker,ctok:client,atok:admin")
    try:
        wait_listening(proc, port)
        with (
            httpx.Client(
                base_url=f"http://127.0.0.1:{port}",
                headers={"Authorization": "Bearer wtok"},
                timeout=20,
            ) as c,
            ThreadPoolExecutor(max_workers=1) as pool,
        ):
            poll = pool.submit(c.get, "/v1/workers/w1/assignments", params={"wait": "1m"})
            time.sleep(0.3)  # the poll is parked on the server
            assert not poll.done()
            started = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            code, _ = finish(proc, timeout=10)
            elapsed = time.monotonic() - started
            assert poll.result(timeout=5).status_code == 204  # cut short, answered
        assert code == 0
        assert elapsed < 6
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
