"""The worker's configuration: ``worker.yaml``, its defaults and its environment overrides.

The file models mirror what a person writes, strictly (§2); ``WorkerConfig`` is what the
worker reads, durations in seconds, defaulted by one idempotent ``apply_defaults``
(WRK-010) whether it came from a file or from code (``make_config``).
"""

from __future__ import annotations

import logging
import os
import pwd
import socket
from collections.abc import Mapping, Sequence
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError

from resource_controller.core import durations, limits
from resource_controller.worker import procs

log = logging.getLogger(__name__)

DEFAULT_PATH = "/etc/rc/worker.yaml"
#: ``devices: auto``: what nvidia-smi lists, MIG instances included.
AUTO = "auto"
#: The shortest GPU sampling interval taken: each reading is a process.
MIN_GPU_SAMPLE_INTERVAL = 0.1
ROOT_STATE_PARENT = "/var/lib/rc-worker"
USER_STATE_SUBDIR = "rc-worker"

_ON_WORDS = frozenset({"1", "t", "T", "true", "TRUE", "True"})
_OFF_WORDS = frozenset({"0", "f", "F", "false", "FALSE", "False"})


class ConfigError(Exception):
    """The configuration cannot be used; the message is the whole one-line story."""


class DeviceConfig(BaseModel):
    """One offered device, after defaults (§2.2)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    #: Runtime ceiling in seconds; 0 means none.
    max_runtime: float = 0.0
    on_acquire: str | None = None
    on_release: str | None = None
    #: Hook timeout and release linger: own, else host, else 60s / 30s.
    timeout: float = 0.0
    release_linger: float = 0.0
    labels: dict[str, str] = Field(default_factory=dict)

    @property
    def max_runtime_seconds(self) -> int:
        """Whole seconds, truncated, as the wire carries it (WRK-019)."""
        return int(self.max_runtime)


class HooksConfig(BaseModel):
    """Host-wide hook defaults (§2.1 ``hooks.*``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    timeout: float = 60.0
    release_linger: float = 30.0


class WorkerConfig(BaseModel):
    """Everything the worker reads from its configuration; the defaults are §2.1's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    controller_url: str
    token: str = ""
    host: str = ""
    devices: tuple[DeviceConfig, ...] = ()
    devices_auto: bool = False
    heartbeat_interval: float = 10.0
    poll_wait: float = 30.0
    hooks: HooksConfig = HooksConfig()
    probe_dir: str = "/etc/rc/probe.d"
    probe_interval: float = 300.0
    probe_timeout: float = 5.0
    verify_dir: str = "/etc/rc/verify.d"
    verify_timeout: float = 30.0
    verify_pass_budget: float = 120.0
    sheet_dir: str = "/etc/rc"
    require_manual_clear: bool = False
    #: Empty until ``apply_defaults`` gives it the per-host default.
    state_dir: str = ""
    #: EXT-ACCT-1; unlike the other durations, 0 is a value (off), not "unset".
    gpu_sample_interval: float = 10.0

    def device_id(self, name: str) -> str:
        """``<host>:<name>``, joined with exactly one colon (§0)."""
        return f"{self.host}:{name}"


#: The values whose unset form (zero or less, an empty path) takes the default (WRK-010).
_DEFAULTED = (
    "heartbeat_interval",
    "poll_wait",
    "probe_dir",
    "probe_interval",
    "probe_timeout",
    "verify_dir",
    "verify_timeout",
    "verify_pass_budget",
    "sheet_dir",
)


def _set_or(value: Any, default: Any) -> Any:
    return value if (value > 0 if isinstance(value, float) else value) else default


def _path_component(host: str) -> str:
    """``host`` as one directory name: never a separator, never ``.`` or ``..``."""
    name = host.replace(os.sep, "_").replace("\0", "_")
    return "_" + name if name in ("", ".", "..") else name


def default_state_dir(
    host: str, *, euid: int | None = None, environ: Mapping[str, str] | None = None
) -> str:
    """One per host name: ``/var/lib/rc-worker/<host>`` for root, else under XDG_STATE_HOME."""
    uid = os.geteuid() if euid is None else euid
    env = os.environ if environ is None else environ
    leaf = _path_component(host)
    if uid == 0:
        return os.path.join(ROOT_STATE_PARENT, leaf)
    base = env.get("XDG_STATE_HOME", "")
    if not os.path.isabs(base):
        home = env.get("HOME", "")
        if not home:
            try:
                home = pwd.getpwuid(uid).pw_dir
            except KeyError:
                home = "/"
        base = os.path.join(home, ".local", "state")
    return os.path.join(base, USER_STATE_SUBDIR, leaf)


def apply_defaults(
    config: WorkerConfig, *, euid: int | None = None, environ: Mapping[str, str] | None = None
) -> WorkerConfig:
    """Give every unset value its default; applying it twice is a no-op (WRK-010, WRK-016)."""
    host = config.host or socket.gethostname()
    hooks = HooksConfig(
        timeout=_set_or(config.hooks.timeout, HooksConfig().timeout),
        release_linger=_set_or(config.hooks.release_linger, HooksConfig().release_linger),
    )
    devices = tuple(
        d.model_copy(
            update={
                "max_runtime": max(d.max_runtime, 0.0),
                "timeout": _set_or(d.timeout, hooks.timeout),
                "release_linger": _set_or(d.release_linger, hooks.release_linger),
            }
        )
        for d in config.devices
    )
    fields = WorkerConfig.model_fields
    update = {k: _set_or(getattr(config, k), fields[k].default) for k in _DEFAULTED}
    return config.model_copy(
        update={
            **update,
            "host": host,
            "devices": devices,
            "hooks": hooks,
            "state_dir": config.state_dir or default_state_dir(host, euid=euid, environ=environ),
        }
    )


def validate_config(config: WorkerConfig, where: str) -> None:
    """The checks of §2.3, however it was built; ``where`` names the source in messages."""
    if not config.controller_url:
        raise ConfigError(f"controller_url required in {where}")
    if config.devices_auto:
        if config.devices:
            raise ConfigError(f'devices: "auto" takes no device list in {where}')
        return
    if not config.devices:
        raise ConfigError(f"at least one device required in {where}")
    interval = config.gpu_sample_interval
    if interval < 0 or 0 < interval < MIN_GPU_SAMPLE_INTERVAL:
        raise ConfigError(
            f"gpu_sample_interval {durations.render_duration(interval)} in {where}: give 0"
            f" (off) or at least {durations.render_duration(MIN_GPU_SAMPLE_INTERVAL)}"
        )
    seen: set[str] = set()
    for d in config.devices:
        if not d.name:
            raise ConfigError(f"device entry needs a name in {where}")
        if not limits.name_ok(d.name):
            # The controller refuses it at registration: say so at start-up.
            raise ConfigError(
                f"device name {d.name!r} in {where} must be at most {limits.NAME_CHARS} "
                f"characters of {limits.NAME_ALPHABET}"
            )
        if d.name in seen:
            raise ConfigError(f"duplicate device name {d.name!r} in {where}")
        seen.add(d.name)
        for key, path in (("on_acquire", d.on_acquire), ("on_release", d.on_release)):
            if path is not None and not path.strip():
                raise ConfigError(f'device "{d.name}": {key} must not be blank')
        if d.max_runtime > limits.SECONDS.high:
            raise ConfigError(
                f'device "{d.name}": max_runtime is above {limits.SECONDS.high}s (68 years), '
                "the largest ceiling the controller accepts (EXT-LIMITS-1)"
            )
        if 0 < d.max_runtime < 1:
            # The wire carries whole seconds, so 500ms would become 0, which
            # means "no ceiling": the opposite of what was written.
            raise ConfigError(
                f'device "{d.name}": max_runtime {durations.render_duration(d.max_runtime)} '
                "is below the one-second granularity at which runtime ceilings are enforced"
            )


def make_config(
    controller_url: str,
    devices: Sequence[str | DeviceConfig],
    *,
    token: str = "",
    host: str = "",
    **settings: Any,
) -> WorkerConfig:
    """A checked configuration built in code (``rc up``, tests); the environment is not read."""
    decls = tuple(DeviceConfig(name=d) if isinstance(d, str) else d for d in devices)
    try:
        raw = WorkerConfig(
            controller_url=controller_url, token=token, host=host, devices=decls, **settings
        )
    except ValidationError as exc:
        raise ConfigError(f"worker config: {_describe(exc)}") from exc
    config = apply_defaults(raw)
    validate_config(config, "the worker configuration")
    return config


class _FileModel(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class _FileHooks(_FileModel):
    timeout: StrictStr | None = None
    release_linger: StrictStr | None = None


class _FileDevice(_FileModel):
    name: StrictStr | None = None
    max_runtime: StrictStr | None = None
    on_acquire: StrictStr | None = None
    on_release: StrictStr | None = None
    timeout: StrictStr | None = None
    release_linger: StrictStr | None = None
    labels: dict[StrictStr, StrictStr] | None = None


class _FileConfig(_FileModel):
    controller_url: StrictStr | None = None
    token: StrictStr | None = None
    host: StrictStr | None = None
    devices: list[StrictStr | _FileDevice] | None = None
    heartbeat_interval: StrictStr | None = None
    poll_wait: StrictStr | None = None
    hooks: _FileHooks | None = None
    probe_dir: StrictStr | None = None
    probe_interval: StrictStr | None = None
    probe_timeout: StrictStr | None = None
    verify_dir: StrictStr | None = None
    verify_timeout: StrictStr | None = None
    verify_pass_budget: StrictStr | None = None
    sheet_dir: StrictStr | None = None
    require_manual_clear: StrictBool | None = None
    state_dir: StrictStr | None = None
    gpu_sample_interval: StrictStr | None = None


#: Every ``float`` setting is a duration, written in the file as text such as ``"30s"``.
_DURATION_KEYS = frozenset(
    name
    for model in (WorkerConfig, DeviceConfig, HooksConfig)
    for name, info in model.model_fields.items()
    if info.annotation is float
)


def _loc_text(loc: Sequence[int | str]) -> str:
    out = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            out += f"[{part}]"
        elif i == 2 and loc[0] == "devices" and part in ("str", "_FileDevice"):
            continue  # pydantic's union-branch marker says nothing to a person
        else:
            out += ("." if out else "") + part
    return out


def _describe(exc: ValidationError) -> str:
    """One line naming the offending key; unknown keys say so plainly."""
    errors = exc.errors()
    # A device entry is a union (bare name or mapping) and reports one error per
    # branch; entries reaching validation as mappings are explained by the mapping one.
    chosen = next(
        (e for e in errors if e["type"] == "extra_forbidden"),
        next((e for e in errors if "_FileDevice" in e["loc"]), errors[0]),
    )
    where = _loc_text(chosen["loc"])
    if chosen["type"] == "extra_forbidden":
        return f"unknown key {where!r}"
    got = chosen.get("input")
    got_text = f"got {type(got).__name__} {got!r}"
    last = chosen["loc"][-1] if chosen["loc"] else ""
    if last in _DURATION_KEYS and chosen["type"] == "string_type":
        return f'{where}: a duration must be a string such as "30s" ({got_text})'
    if chosen["type"] in ("model_type", "dict_type"):
        return f"{where}: must be a mapping ({got_text})"
    return f"{where}: {chosen['msg'].lower()} ({got_text})"


def _read_yaml(text: str) -> Any:
    """The YAML, but ``3`` must become ``"3"`` and ``1.50`` stay ``"1.50"`` in
    ``devices[].labels``, which a plain load cannot promise: labels come from the node tree."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            return {}
        if not isinstance(root, yaml.MappingNode):
            return loader.construct_object(root, deep=True)
        return _mapping(loader, root, depth=0)
    finally:
        loader.dispose()


def _mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, depth: int) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        if depth == 0 and key == "devices" and isinstance(value_node, yaml.SequenceNode):
            out[key] = [
                _mapping(loader, item, depth=1)
                if isinstance(item, yaml.MappingNode)
                else loader.construct_object(item, deep=True)
                for item in value_node.value
            ]
        elif depth == 1 and key == "labels" and isinstance(value_node, yaml.MappingNode):
            out[key] = _literal_labels(loader, value_node)
        else:
            out[key] = loader.construct_object(value_node, deep=True)
    return out


def _literal_labels(loader: yaml.SafeLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    loader.flatten_mapping(node)
    out: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key: Any = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
        if isinstance(value_node, yaml.ScalarNode):
            null = value_node.tag == "tag:yaml.org,2002:null"
            out[key] = "" if null else value_node.value
        else:
            # A list or mapping has no literal text: let validation name it.
            out[key] = loader.construct_object(value_node, deep=True)
    return out


def _yaml_error_text(path: str, exc: yaml.YAMLError) -> str:
    """``<path>: line L, column C: <problem> (<context>)``, on one line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        text = f"{path}: line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        if exc.context:
            text += f" ({exc.context})"
        return " ".join(text.split())
    return " ".join(str(exc).split())


def _values(section: _FileModel, prefix: str = "", skip: set[str] | None = None) -> dict[str, Any]:
    """A file section's values that were given, its durations in seconds."""
    values = section.model_dump(exclude_none=True, exclude=skip)
    for key in [k for k in values if k in _DURATION_KEYS]:
        try:
            values[key] = durations.parse_duration(values[key])
        except durations.DurationError as exc:
            raise ConfigError(
                f"parse worker config: {prefix}{key}: invalid duration {values[key]!r}"
            ) from exc
    return values


def _manual_clear_from_env(value: str | None) -> bool:
    """``RC_REQUIRE_MANUAL_CLEAR``: it can only ever turn the setting on."""
    text = (value or "").strip()
    if not text or text in _OFF_WORDS:
        return False
    if text not in _ON_WORDS:
        # A typo is read as "be cautious": misreading it as "no" would hand devices back.
        log.warning(
            "RC_REQUIRE_MANUAL_CLEAR=%r is not a recognised boolean; treating it as true",
            text,
            extra={"action": "config_env"},
        )
    return True


def load_config(
    path: str, environ: Mapping[str, str] | None = None, *, euid: int | None = None
) -> WorkerConfig:
    """Read, validate and default ``worker.yaml``, then apply WRK-020/021."""
    env = os.environ if environ is None else environ
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ConfigError("read worker config: " + procs.os_error_text("open", path, exc)) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"read worker config: {path}: not UTF-8 text ({exc})") from exc
    try:
        data = _read_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"parse worker config: {_yaml_error_text(path, exc)}") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"parse worker config: top level must be a mapping, got {type(data).__name__}"
        )
    entries = data.get("devices")
    auto = isinstance(entries, str)
    if auto:
        if entries != AUTO:
            raise ConfigError(
                f'parse worker config: devices: a list of devices or "{AUTO}" (got {entries!r})'
            )
        data = {k: v for k, v in data.items() if k != "devices"}
    for i, device in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(device, dict) and device.get("name") is None:
            raise ConfigError(f"device entry needs a name in {path}")
        if not isinstance(device, str | dict):
            raise ConfigError(
                f"parse worker config: devices[{i}]: a device entry is a name or a mapping "
                f"(got {type(device).__name__} {device!r})"
            )
    off = data.get("gpu_sample_interval")
    if off == 0 and type(off) is int:
        # EXT-ACCT-1 writes "0 turns it off": a bare 0 reads as the duration "0" here,
        # where any other bare number is still refused for want of a unit.
        data = {**data, "gpu_sample_interval": "0"}
    try:
        raw = _FileConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"parse worker config: {_describe(exc)}") from exc
    devices = [
        DeviceConfig(name=d) if isinstance(d, str) else DeviceConfig(**_values(d, f"devices[{i}]."))
        for i, d in enumerate(raw.devices or [])
    ]
    values = _values(raw, skip={"devices", "hooks", "token", "require_manual_clear"})
    # Only when the file says nothing; an explicit file token always wins (WRK-020).
    token = raw.token or env.get("RC_TOKEN", "").strip()
    manual = bool(raw.require_manual_clear) or _manual_clear_from_env(
        env.get("RC_REQUIRE_MANUAL_CLEAR")
    )
    resolved = WorkerConfig(
        **{"controller_url": "", **values},
        token=token,
        devices=tuple(devices),
        devices_auto=auto,
        hooks=HooksConfig(**_values(raw.hooks, "hooks.")) if raw.hooks else HooksConfig(),
        require_manual_clear=manual,
    )
    config = apply_defaults(resolved, euid=euid, environ=env)
    validate_config(config, path)
    return config
