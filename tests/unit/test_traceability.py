"""The requirements table (``docs/traceability.md``) matches the tests' citations."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_traceability_table_is_current() -> None:
    spec = importlib.util.spec_from_file_location("traceability", ROOT / "scripts/traceability.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    want = module.render(module.citations(ROOT / "tests"))
    assert (ROOT / "docs/traceability.md").read_text(encoding="utf-8") == want, (
        "docs/traceability.md is stale: run python scripts/traceability.py"
    )
    assert "| STORE-061 |" in want and "| EXT-SHARE-1 |" in want
