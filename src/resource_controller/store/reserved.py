"""The reservation rows as the last scheduling pass left them, kept between passes.

A pass compares the reservations it plans with the rows there (STORE-061: rewritten
only when they changed), and over a long queue on a busy fleet there are thousands of
rows: reading them back was a tenth of a pass over 10,000 pinned jobs. Only the pass
inserts reservation rows; every other writer deletes (an assignment its device's, a
cancel its job's, a retirement its device's). So while no other connection has written
the file (SQLite's ``data_version``) and the table holds as many rows as the pass left,
they are the rows it left, and one count stands for reading them. Where the database
has no such number (PostgreSQL, where other controllers write), the rows are read
every time.
"""

from __future__ import annotations

from resource_controller.store import queries

_ROWS = "SELECT device_id, job_id FROM reservations"
_COUNT = "SELECT count(*) FROM reservations"


class KeptReservations:
    """Device -> job, as of the last pass's write or read; used under the store's lock."""

    def __init__(self) -> None:
        self._rows: dict[str, str] | None = None  #: None = read them next time
        self._version: int | None = None  #: ``data_version`` when they were kept

    def read(self, conn: queries.Conn) -> dict[str, str]:
        """The rows there now (device -> job); the caller must not change what it gets."""
        db = conn
        version = db.data_version()
        if self._rows is not None and version is not None and version == self._version:
            (count,) = db.execute(_COUNT).fetchone()
            if count == len(self._rows):
                return self._rows
        rows = dict(db.execute(_ROWS).fetchall())
        self._rows, self._version = rows, version
        return rows

    def wrote(self, conn: queries.Conn, rows: dict[str, str]) -> None:
        """The pass committed exactly ``rows``."""
        self._rows = rows
        self._version = conn.data_version()

    def forget(self) -> None:
        self._rows = None
