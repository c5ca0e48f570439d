"""Writing the user config file, for ``rc up``: kept apart from ``config``, which reads
it on every ``rc`` start and must stay cheap to import."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from resource_controller.client.config import (
    FLAG_LINE,
    KEYS,
    SECTIONS,
    SIMPLE_LINE,
    ClientConfigError,
    config_path,
    one_line,
    parse_simple,
    reset,
    unknown_key_names,
    unknown_keys,
)


def _render(values: Mapping[str, object]) -> str:
    lines = []
    rest: dict[str, object] = {}
    for key, value in values.items():
        if isinstance(value, str) and SIMPLE_LINE.fullmatch(f"{key}: {json.dumps(value)}"):
            lines.append(f"{key}: {json.dumps(value)}\n")
            continue
        if isinstance(value, dict) and len(value) == 1:
            ((sub, flag),) = value.items()
            line = f"{key}: {{{sub}: {'true' if flag else 'false'}}}"
            if isinstance(flag, bool) and FLAG_LINE.fullmatch(line):
                lines.append(line + "\n")
                continue
        rest[key] = value
    text = "".join(lines)
    if rest:
        import yaml

        text += yaml.safe_dump(rest, default_flow_style=False, sort_keys=False)
    return text


class ClientConfigUpdate(NamedTuple):
    """What ``update_client_config`` did, so that ``rc up`` can say it."""

    path: Path
    written: tuple[str, ...]
    kept: Mapping[str, object]


def update_client_config(
    controller: str,
    token: str,
    force: bool,
    env: Mapping[str, str] | None = None,
) -> ClientConfigUpdate:
    """Record the client side of a local setup in the user config file.

    Existing values win unless ``force``, so a shared controller is not silently
    redirected; ``run.here`` is a preference, kept even with ``force``.
    """
    path = config_path(env)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        text = ""
    except (OSError, UnicodeDecodeError) as e:
        if not force:
            raise ClientConfigError(f"cannot read {path}: {e}") from e
        text = ""
    existing: dict[str, object] = {}
    if text.strip():
        try:
            existing = _load_all(text, path)
        except ClientConfigError:
            if not force:
                raise
    unknown = unknown_key_names(existing)
    if unknown and not force:
        # Kept, such a key would leave a file every rc command refuses.
        raise unknown_keys(path, unknown, "; fix or remove it, or rc up --force drops it")
    existing = _known_only(existing)
    written: list[str] = []
    kept: dict[str, object] = {}
    for key, value in (("controller", controller), ("token", token)):
        current = existing.get(key)
        keep = isinstance(current, str) and current.strip() and not force
        if keep:
            kept[key] = current
        else:
            existing[key] = value
            written.append(key)
    run = existing.get("run")
    if isinstance(run, dict) and run.get("here") is not None:
        kept["run.here"] = run["here"]
    else:
        existing["run"] = {**(run if isinstance(run, dict) else {}), "here": True}
        written.append("run.here")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(_render(existing))
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    reset()
    return ClientConfigUpdate(path, tuple(written), kept)


def _known_only(values: Mapping[str, object]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in values.items():
        if key in SECTIONS and isinstance(value, dict):
            out[key] = {k: v for k, v in value.items() if k in SECTIONS[key]}
        elif key in KEYS or key in SECTIONS:
            out[key] = value
    return out


def _load_all(text: str, path: Path) -> dict[str, object]:
    simple = parse_simple(text)
    if simple is not None:
        return dict(simple)
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ClientConfigError(f"cannot parse {path}: {one_line(str(e))}") from e
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ClientConfigError(f"cannot parse {path}: the top level is not a mapping")
    return {str(k): v for k, v in data.items()}
