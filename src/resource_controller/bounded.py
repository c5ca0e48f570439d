"""Pydantic field types that enforce ``core.limits``: each refusal's message names the
limit (``deps.parse_model`` prefixes the field: ``command: at most 4096 arguments``),
and the OpenAPI schema carries the same bounds; byte sizes, which JSON Schema cannot
state, as ``maxLength`` in characters plus ``x-max-bytes``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StrictInt, StrictStr
from pydantic_core import PydanticCustomError

from resource_controller.core import limits


def _refuse(message: str) -> PydanticCustomError:
    return PydanticCustomError("limit", message)


def _in_range(bound: limits.IntRange) -> Callable[[int], int]:
    def check(value: int) -> int:
        if not bound.low <= value <= bound.high:
            raise _refuse(f"must be an integer in {bound.text()}")
        return value

    return check


def _text(bound: limits.Size) -> Callable[[str], str]:
    def check(value: str) -> str:
        if limits.utf8_len(value) > bound.size:
            raise _refuse(f"at most {bound.size} bytes")
        return value

    return check


def _argv(bound: limits.Size) -> Callable[[list[str]], list[str]]:
    def check(value: list[str]) -> list[str]:
        if bound.count is not None and len(value) > bound.count:
            raise _refuse(f"at most {bound.count} {bound.unit}")
        if sum(limits.utf8_len(a) for a in value) > bound.size:
            raise _refuse(f"at most {bound.size} bytes in all")
        return value

    return check


def _mapping(bound: limits.Size) -> Callable[[dict[str, str]], dict[str, str]]:
    def check(value: dict[str, str]) -> dict[str, str]:
        if bound.count is not None and len(value) > bound.count:
            raise _refuse(f"at most {bound.count} {bound.unit}")
        total = sum(limits.utf8_len(k) + limits.utf8_len(v) for k, v in value.items())
        if total > bound.size:
            raise _refuse(f"at most {bound.size} bytes in all (keys and values)")
        return value

    return check


def _ids(bound: limits.Size) -> Callable[[list[str]], list[str]]:
    def check(value: list[str]) -> list[str]:
        if bound.count is not None and len(value) > bound.count:
            raise _refuse(f"at most {bound.count} {bound.unit}")
        for item in value:
            if limits.utf8_len(item) > bound.size:
                raise _refuse(f"a job ID is at most {bound.size} bytes, got {item[:80]!r}")
        return value

    return check


def _name(kind: str) -> Callable[[str], str]:
    def check(value: str) -> str:
        if not limits.name_ok(value):
            shown = value if len(value) <= 2 * limits.NAME_CHARS else value[:64] + "..."
            raise _refuse(
                f"{kind} name {shown!r} must be at most {limits.NAME_CHARS} characters "
                f"of {limits.NAME_ALPHABET}"
            )
        return value

    return check


def _schema(**extra: Any) -> Any:
    return Field(json_schema_extra=extra)


def _bytes_schema(bound: limits.Size) -> Any:
    return _schema(maxLength=bound.size, **{"x-max-bytes": bound.size})


Seconds = Annotated[
    StrictInt,
    AfterValidator(_in_range(limits.SECONDS)),
    _schema(minimum=limits.SECONDS.low, maximum=limits.SECONDS.high),
]
ExitCode = Annotated[
    StrictInt,
    AfterValidator(_in_range(limits.EXIT_CODE)),
    _schema(minimum=limits.EXIT_CODE.low, maximum=limits.EXIT_CODE.high),
]
DeviceCount = Annotated[
    StrictInt,
    AfterValidator(_in_range(limits.DEVICE_COUNT)),
    _schema(minimum=limits.DEVICE_COUNT.low, maximum=limits.DEVICE_COUNT.high),
]
Retries = Annotated[
    StrictInt,
    AfterValidator(_in_range(limits.RETRIES)),
    _schema(minimum=limits.RETRIES.low, maximum=limits.RETRIES.high),
]
DeviceIds = Annotated[
    list[StrictStr],
    Field(max_length=limits.DEVICE_COUNT.high),
]
#: The jobs a job waits for.
AfterIds = Annotated[
    list[StrictStr],
    AfterValidator(_ids(limits.AFTER)),
    _schema(maxItems=limits.AFTER.count, **{"x-max-bytes": limits.AFTER.size}),
]
Command = Annotated[
    list[StrictStr],
    AfterValidator(_argv(limits.COMMAND)),
    _schema(maxItems=limits.COMMAND.count, **{"x-max-bytes": limits.COMMAND.size}),
]
Env = Annotated[
    dict[str, StrictStr],
    AfterValidator(_mapping(limits.ENV)),
    _schema(maxProperties=limits.ENV.count, **{"x-max-bytes": limits.ENV.size}),
]
Cwd = Annotated[StrictStr, AfterValidator(_text(limits.CWD)), _bytes_schema(limits.CWD)]
SelectorText = Annotated[
    StrictStr, AfterValidator(_text(limits.SELECTOR)), _bytes_schema(limits.SELECTOR)
]
Submitter = Annotated[
    StrictStr, AfterValidator(_text(limits.SUBMITTER)), _bytes_schema(limits.SUBMITTER)
]
Reason = Annotated[StrictStr, AfterValidator(_text(limits.REASON)), _bytes_schema(limits.REASON)]
#: An array's index spec (EXT-ARRAY-1), bounded as a reason is: ``core.arrays`` caps its tasks.
ArraySpecText = Reason
IdempotencyKey = Annotated[
    StrictStr, AfterValidator(_text(limits.IDEMPOTENCY_KEY)), _bytes_schema(limits.IDEMPOTENCY_KEY)
]
_NAME_SCHEMA = _schema(maxLength=limits.NAME_CHARS, pattern=r"^[A-Za-z0-9._-]*$")
HostName = Annotated[StrictStr, AfterValidator(_name("host")), _NAME_SCHEMA]
DeviceName = Annotated[StrictStr, AfterValidator(_name("device")), _NAME_SCHEMA]


def _measured(high: float, integral: bool) -> Callable[[Any], Any]:
    """A number in ``0..high`` as sent, anything else as ``None``: a bad reading is
    unknown, never a refused report (a terminal report refused for it would be retried
    for ever, and the device held)."""

    def read(value: Any) -> Any:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        if not math.isfinite(value) or not 0 <= value <= high:
            return None
        if integral:
            return int(value) if float(value).is_integer() else None
        return float(value)

    return read


#: Mean GPU utilisation, percent.
UtilPercent = Annotated[float | None, BeforeValidator(_measured(100, integral=False))]
#: Bytes of GPU memory.
MeasuredBytes = Annotated[int | None, BeforeValidator(_measured(2**63 - 1, integral=True))]
#: How many readings.
MeasuredCount = Annotated[int | None, BeforeValidator(_measured(2**31 - 1, integral=True))]
