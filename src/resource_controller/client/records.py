"""``NamedTuple`` for the modules on ``rc``'s start-up path, without importing ``typing``.

``typing`` costs ``rc run`` a noticeable share of its start-up, and the client's
records only need what ``collections.namedtuple`` already gives. Modules write::

    TYPE_CHECKING = False
    if TYPE_CHECKING:
        from typing import NamedTuple
    else:
        from resource_controller.client.records import NamedTuple

and declare ``class X(NamedTuple): ...`` as usual: type checkers see ``typing``'s, the
interpreter builds the same tuple class from the annotations, defaults, methods and
properties of the class body.
"""

from __future__ import annotations

import collections

#: Names in a class body that belong to the class machinery, not to the record.
_MACHINERY = frozenset({"__annotations__", "__dict__", "__weakref__", "__qualname__"})


class _RecordMeta(type):
    def __new__(mcls, name: str, bases: tuple[type, ...], ns: dict[str, object]) -> type:
        if not bases:
            return super().__new__(mcls, name, bases, ns)  # ``NamedTuple`` itself
        annotations = ns.get("__annotations__", {})
        assert isinstance(annotations, dict)
        fields = list(annotations)
        defaults = [ns[f] for f in fields if f in ns]
        if any(f in ns for f in fields[: len(fields) - len(defaults)]):
            raise TypeError(f"{name}: a field without a default follows one with a default")
        module = str(ns.get("__module__", __name__))
        base = collections.namedtuple(name, fields, defaults=defaults, module=module)  # type: ignore[misc]
        body = {k: v for k, v in ns.items() if k not in _MACHINERY and k not in fields}
        body["__slots__"] = ()
        body["__qualname__"] = ns.get("__qualname__", name)
        return type(name, (base,), body)


class NamedTuple(metaclass=_RecordMeta):
    """Subclass it as ``typing.NamedTuple`` (fields from annotations, defaults last)."""
