"""A database already at the newest schema opens without SQLAlchemy or Alembic (the store
talks to the driver): ``engine.HEAD`` names that revision, and must be the migrations
directory's head, or a new migration would never run."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

from alembic.script import ScriptDirectory

from resource_controller.clock import FakeClock
from resource_controller.store import engine
from resource_controller.store.facade import Store


def test_head_is_the_newest_migration() -> None:
    assert ScriptDirectory(str(engine.MIGRATIONS)).get_current_head() == engine.HEAD


def test_a_current_database_opens_without_loading_sqlalchemy_or_alembic(tmp_path: Path) -> None:
    Store(tmp_path / "rc.db", FakeClock()).close()  # created and migrated here
    probe = (
        "import sys\n"
        "from resource_controller.clock import FakeClock\n"
        "from resource_controller.store.facade import Store\n"
        f"Store({str(tmp_path / 'rc.db')!r}, FakeClock()).close()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('alembic', 'sqlalchemy')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "[]"


def test_a_fresh_database_is_migrated_to_the_head(tmp_path: Path) -> None:
    store = Store(tmp_path / "rc.db", FakeClock())
    store.close()
    with sqlite3.connect(tmp_path / "rc.db") as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == (engine.HEAD,)
