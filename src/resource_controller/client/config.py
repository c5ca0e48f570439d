"""Where the client finds its controller, token and name: ``--as``, environment, config
file, default. A broken file (an unknown key included, so a typo cannot look like a
setting) costs one warning and counts as absent. The form ``rc up`` writes is read
without PyYAML, which would cost more than the rest of ``rc run``'s start.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping

from resource_controller import errors

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from pathlib import Path
    from typing import Any, NamedTuple
else:
    from resource_controller.client.records import NamedTuple

DEFAULT_CONTROLLER = "http://localhost:8080"

#: What a transport failure says when nothing configured the controller.
DEFAULT_ORIGIN = (
    "is the built-in default; nothing configures a controller: run rc up to start a local"
    " one, or set RC_CONTROLLER"
)

KEYS = ("controller", "token", "submitter")
SECTIONS = {"run": ("here",)}
KNOWN_KEYS = "controller, token, submitter and run.here"


class ClientConfigError(errors.ClientError):
    """The user config file could not be located, read or parsed."""


class FileConfig(NamedTuple):
    """The file's values, ``None`` when absent; not a dataclass, which costs more to import."""

    controller: str | None = None
    token: str | None = None
    submitter: str | None = None
    run_here: bool | None = None


def config_path(env: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    from pathlib import Path

    return Path(config_location(env, platform))


def config_location(env: Mapping[str, str] | None = None, platform: str | None = None) -> str:
    """``config_path`` as text, since ``rc run`` reads it on every start and ``pathlib`` is slow to import."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    explicit = env.get("RC_CONFIG", "").strip()
    if explicit:
        return _posix_text(explicit)
    xdg = env.get("XDG_CONFIG_HOME", "")
    if xdg:
        if not os.path.isabs(xdg):
            raise ClientConfigError(
                f"cannot locate the config file: XDG_CONFIG_HOME is relative: {xdg}"
            )
        base = xdg
    else:
        home = env.get("HOME", "")
        if not home:
            raise ClientConfigError(
                "cannot locate the config file: neither XDG_CONFIG_HOME nor HOME set"
            )
        base = home + "/" + ("Library/Application Support" if platform == "darwin" else ".config")
    return _posix_text(base + "/rc/config.yaml")


def _posix_text(path: str) -> str:
    """``str(PurePosixPath(path))``: empty and ``.`` parts dropped, ``//`` kept as a root."""
    root = "//" if path[:2] == "//" and path[:3] != "///" else "/" if path[:1] == "/" else ""
    return root + "/".join(p for p in path.split("/") if p and p != ".") or "."


# JSON string syntax is a subset of YAML's double-quoted scalar: both parsers agree.
SIMPLE_LINE = re.compile(
    r'([A-Za-z_][A-Za-z0-9_-]*):[ \t]+("(?:[^"\\\x00-\x1f]|\\.)*")[ \t]*(?:#.*)?'
)
# ``run: {here: true}``, which YAML reads the same way.
FLAG_LINE = re.compile(
    r"([A-Za-z_][A-Za-z0-9_-]*):[ \t]+\{[ \t]*([A-Za-z_]+):[ \t]+(true|false)[ \t]*\}[ \t]*(?:#.*)?"
)


def parse_simple(text: str) -> dict[str, object] | None:
    out: dict[str, object] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        flag = FLAG_LINE.fullmatch(line.rstrip())
        if flag is not None and flag.group(1) not in out:
            out[flag.group(1)] = {flag.group(2): flag.group(3) == "true"}
            continue
        m = SIMPLE_LINE.fullmatch(line.rstrip())
        if m is None or m.group(1) in out:
            return None
        try:
            out[m.group(1)] = json.loads(m.group(2))
        except ValueError:
            return None
    return out


def _parse_yaml(text: str, path: Path | str) -> dict[str, object]:
    """The node tree rather than ``safe_load``, so ``token: 0123`` stays a string."""
    import yaml

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        raise ClientConfigError(f"cannot parse {path}: {one_line(str(e))}") from e
    out: dict[str, object] = {}
    if root is None:
        return out
    if not isinstance(root, yaml.MappingNode):
        raise ClientConfigError(f"cannot parse {path}: the top level is not a mapping")
    unknown: list[str] = []
    for key_node, value_node in root.value:
        key = _key_text(yaml, key_node)
        if key == "run":
            out["run"] = _run_section(yaml, value_node, path, unknown)
            continue
        if key not in KEYS:
            unknown.append(key)
            continue
        if not isinstance(value_node, yaml.ScalarNode):
            raise ClientConfigError(f"cannot parse {path}: {key} is not a string")
        is_null = value_node.tag == "tag:yaml.org,2002:null"
        out[key] = None if is_null else value_node.value
    if unknown:
        raise unknown_keys(path, unknown)
    return out


def _key_text(yaml: Any, node: Any) -> str:
    if isinstance(node, yaml.ScalarNode):
        return str(node.value)
    return "(a key that is not text)"


def _run_section(yaml: Any, node: Any, path: Path | str, unknown: list[str]) -> dict[str, bool]:
    if node.tag == "tag:yaml.org,2002:null":
        return {}
    if not isinstance(node, yaml.MappingNode):
        raise ClientConfigError(f"cannot parse {path}: run is not a mapping")
    out: dict[str, bool] = {}
    for key_node, value_node in node.value:
        key = _key_text(yaml, key_node)
        if key != "here":
            unknown.append(f"run.{key}")
            continue
        if value_node.tag != "tag:yaml.org,2002:bool":
            raise ClientConfigError(f"cannot parse {path}: run.here is not true or false")
        out["here"] = str(value_node.value).lower() in ("y", "yes", "true", "on")
    return out


def unknown_key_names(values: Mapping[str, object]) -> list[str]:
    found: list[str] = []
    for key, value in values.items():
        if key in KEYS:
            continue
        if key in SECTIONS:
            if isinstance(value, dict):
                found.extend(f"{key}.{sub}" for sub in value if sub not in SECTIONS[key])
            continue
        found.append(key)
    return found


def unknown_keys(path: Path | str, names: list[str], advice: str = "") -> ClientConfigError:
    plural = "s" if len(names) > 1 else ""
    return ClientConfigError(
        f"{path}: unknown key{plural} {', '.join(names)} (rc reads {KNOWN_KEYS})"
        + (advice or "; the file is not used until that is fixed")
    )


def one_line(text: str) -> str:
    return " ".join(text.split())


def parse_config(text: str, path: Path | str) -> FileConfig:
    values: Mapping[str, object] | None = parse_simple(text)
    if values is None:
        values = _parse_yaml(text, path)
    else:
        unknown = unknown_key_names(values)
        if unknown:
            raise unknown_keys(path, unknown)

    def pick(key: str) -> str | None:
        value = values.get(key)
        if value is not None and not isinstance(value, str):
            raise ClientConfigError(f"cannot parse {path}: {key} is not a string")
        value = value.strip() if value is not None else None
        return value or None

    run = values.get("run")
    here = run.get("here") if isinstance(run, dict) else None
    if here is not None and not isinstance(here, bool):
        raise ClientConfigError(f"cannot parse {path}: run.here is not true or false")
    return FileConfig(pick("controller"), pick("token"), pick("submitter"), here)


def read_config_file(path: Path | str, named_by: str = "") -> FileConfig:
    """A missing file named by ``RC_CONFIG`` is an error: a misspelt path must not look empty."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if named_by:
            raise ClientConfigError(f"{named_by} names {path}, which does not exist") from None
        return FileConfig()
    except OSError as e:
        raise ClientConfigError(f"cannot read {path}: {e.strerror or e}") from e
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ClientConfigError(f"cannot parse {path}: not UTF-8 text") from e
    return parse_config(text, path)


def _warn(message: str) -> None:
    sys.stderr.write(f"rc: warning: {message}\n")
    sys.stderr.flush()


class ClientSettings:
    """Connection settings and identity for one process, reading the file on demand."""

    def __init__(
        self,
        env: Mapping[str, str] | None = None,
        warn: Callable[[str], None] = _warn,
    ) -> None:
        self._env = os.environ if env is None else env
        self._warn = warn
        self._file: FileConfig | None = None
        self._location = ""
        self._problem = ""

    @property
    def file(self) -> FileConfig:
        if self._file is None:
            try:
                self._location = config_location(self._env)
                named_by = "RC_CONFIG" if self._env.get("RC_CONFIG", "").strip() else ""
                self._file = read_config_file(self._location, named_by)
            except ClientConfigError as e:
                self._warn(e.message)
                self._problem = e.message
                self._file = FileConfig()
        return self._file

    def controller(self) -> str:
        url = self._env.get("RC_CONTROLLER", "") or self.file.controller or DEFAULT_CONTROLLER
        return url.rstrip("/")

    def controller_origin(self) -> str:
        if self._env.get("RC_CONTROLLER", ""):
            return "from RC_CONTROLLER"
        if self.file.controller:
            try:
                return f"from the config file {config_location(self._env)}"
            except ClientConfigError:  # pragma: no cover - the file was read, so it was found
                return "from the config file"
        return DEFAULT_ORIGIN

    def token(self) -> str:
        return self._env.get("RC_TOKEN", "") or self.file.token or ""

    def missing_token(self) -> str:
        """So a new user told ``unauthorized`` learns what to set, not only that it failed."""
        if self._env.get("RC_TOKEN", ""):
            return ""
        self.file  # noqa: B018 - the lookup this sentence reports on
        where = "RC_TOKEN is not set"
        if self._problem:
            return f"no token was found: {where}, and {self._problem}"
        if not self._location:  # pragma: no cover - a failed location sets the problem
            return f"no token was found: {where}"
        if not os.path.exists(self._location):
            found = f"{self._location} does not exist (rc up writes it)"
        else:
            found = f"{self._location} has no token"
        return (
            f"no token was found: {where} and {found}; export RC_TOKEN=<client token>"
            " or put token: <client token> in that file"
        )

    def connection(
        self, controller: str | None = None, token: str | None = None
    ) -> tuple[str, str, str, Callable[[], str] | None]:
        if controller:
            url, origin = controller, "given to the client"
        else:
            url, origin = self.controller(), self.controller_origin()
        if token is not None:
            return url, token, origin, None
        return url, self.token(), origin, self.missing_token

    def run_here(self) -> bool:
        return bool(self.file.run_here)

    def submitter(self, as_flag: str = "") -> str:
        return (
            as_flag
            or self._env.get("RC_SUBMITTER", "").strip()
            or self.file.submitter
            or derived_submitter(self._env)
        )


def derived_submitter(env: Mapping[str, str]) -> str:
    try:
        host = os.uname().nodename
    except (AttributeError, OSError):
        host = ""
    name = f"{env.get('USER', '')}@{host}"
    session = env.get("CLAUDE_SESSION_ID", "")
    return f"{name}/{session}" if session else name


_PROCESS_SETTINGS: ClientSettings | None = None


def settings() -> ClientSettings:
    global _PROCESS_SETTINGS
    if _PROCESS_SETTINGS is None:
        _PROCESS_SETTINGS = ClientSettings()
    return _PROCESS_SETTINGS


def reset() -> None:
    global _PROCESS_SETTINGS
    _PROCESS_SETTINGS = None
