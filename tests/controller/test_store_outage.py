"""A database the controller cannot reach (PostgreSQL down, a network cut) answers the
spec's ``500 store_error`` (API-090), which sends clients and workers to the next
controller of their list like any 5xx (EXT-PG-5), and ``GET /healthz`` answers 503
(EXT-METRICS-3); once it can be reached again the next request is served."""

from __future__ import annotations

from urllib.parse import urlsplit

import psycopg
import pytest
from controller_harness import Harness, assert_error

from support import pg


def _shut(cluster: pg.Cluster, url: str, shut: bool) -> None:
    """Refuse (or allow again) every connection to the test's database, ending those
    open: what the controller sees of a server that went away."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(cluster.url(), autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS {'false' if shut else 'true'}")
        if shut:
            admin.execute(
                "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE datname = %s",
                (name,),
            )


def test_an_unreachable_database_answers_500_store_error_then_recovers(
    rc: Harness, database: str, backend: str, pg_cluster: pg.Cluster
) -> None:
    if backend != "postgresql":
        pytest.skip("a PostgreSQL server that goes away")
    _shut(pg_cluster, database, True)
    try:
        message = assert_error(rc.client.get("/v1/jobs"), 500, "store_error")
        assert "cannot be reached" in message and "psycopg" not in message
        health = rc.anon.get("/healthz")
        assert health.status_code == 503 and health.json()["status"] == "unavailable"
    finally:
        _shut(pg_cluster, database, False)
    assert rc.client.get("/v1/jobs").json() == {"jobs": []}
