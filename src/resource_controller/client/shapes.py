"""Where the controller's answers hold lists and maps, so that ``null`` reads as empty.

The reference controller's JSON encoder writes ``null`` for an empty list or map: a
job's ``"env": null``, a state's ``"queued": null``. This client reads such an answer
as if the controller had written ``[]``/``{}`` where the field is always present, and
as if it had left the key out where this project omits it when empty, so commands and
``--json`` output see the shapes this project's controller sends. Kept free of
pydantic, and of dataclasses, which with ``inspect`` would cost more than the rest of
the client (``rc run`` is on the hot path); a test checks these shapes against the
response models in ``wire``.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not ``typing``'s: importing it costs rc's start-up
if TYPE_CHECKING:
    from typing import Any


class List:
    """A JSON array; ``item`` describes its elements when they hold lists or maps."""

    __slots__ = ("item",)

    def __init__(self, item: Shape | None = None) -> None:
        self.item = item


class Map:
    """A JSON object with free keys; ``value`` describes its values."""

    __slots__ = ("value",)

    def __init__(self, value: Shape | None = None) -> None:
        self.value = value


class Obj:
    """A JSON object with named fields; ``keep`` names the lists/maps always present."""

    __slots__ = ("fields", "keep")

    def __init__(
        self, fields: dict[str, Shape] | None = None, keep: frozenset[str] = frozenset()
    ) -> None:
        self.fields: dict[str, Shape] = fields if fields is not None else {}
        self.keep = keep


Shape = List | Map | Obj


def normalise(value: Any, shape: Shape | None) -> Any:
    """``value`` with ``null`` made empty (or left out) wherever ``shape`` has a list or map."""
    if shape is None:
        return value
    if isinstance(shape, List):
        if value is None:
            return []
        if isinstance(value, list) and shape.item is not None:
            return [normalise(v, shape.item) for v in value]
        return value
    if isinstance(shape, Map):
        if value is None:
            return {}
        if isinstance(value, dict) and shape.value is not None:
            return {k: normalise(v, shape.value) for k, v in value.items()}
        return value
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, v in value.items():
        sub = shape.fields.get(key)
        if v is None:
            if key in shape.keep and sub is not None:
                out[key] = normalise(None, sub)
            # else: null for an optional field means the same as absent
            continue
        out[key] = normalise(v, sub)
    return out


LABEL = Obj()
JOB = Obj(
    # device_ids: EXT-GANG-6; after: EXT-SHARE-2; attempts: EXT-RETRY-1
    {
        "command": List(),
        "env": Map(),
        "device_ids": List(),
        "after": List(),
        "attempts": List(Obj({"device_ids": List()})),
    },
    keep=frozenset({"command"}),
)
#: A queued job's ``waiting_for`` entries: ``preempting`` (EXT-PREEMPT-2) is their one list.
WAITING_FOR = List(Obj({"preempting": List()}))
JOB_VIEW = Obj({"job": JOB, "waiting_for": WAITING_FOR})
JOB_LIST = Obj({"jobs": List(JOB)}, keep=frozenset({"jobs"}))
DEVICE = Obj({"labels": List(LABEL)})
DEVICE_VIEW = Obj({"device": DEVICE, "command": List()})
DEVICE_VIEWS = List(DEVICE_VIEW)
STATE = Obj(
    {
        "devices": DEVICE_VIEWS,
        "jobs": List(JOB),
        "queued": List(JOB),
        "queued_waiting_seconds": Map(),
        "queued_waiting_for": Map(WAITING_FOR),
    },
    keep=frozenset({"devices", "jobs", "queued"}),
)
RECOVERY_HISTORY = Obj({"recoveries": List(Obj())}, keep=frozenset({"recoveries"}))
DESCRIBE = Obj(
    {
        "device": DEVICE,
        "labels": List(LABEL),
        "label_age_seconds": Map(),
        "recent_jobs": List(JOB),
        "recoveries": RECOVERY_HISTORY,
    }
)
EXPLAIN = Obj({"matching": List(), "free": List()}, keep=frozenset({"matching", "free"}))
#: ``GET /v1/usage``; no group holds a list or a map.
USAGE = Obj({"groups": List(Obj()), "total": Obj()}, keep=frozenset({"groups"}))
