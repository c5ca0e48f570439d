"""The limits file of ``rc serve --limits FILE`` (EXT-SHARE-1): ``limits: {alice: 4, "*": 2}``; a
bad file reread on SIGHUP leaves the limits in force."""

from __future__ import annotations

from pathlib import Path

import yaml

from resource_controller.core import limits as bounds
from resource_controller.core.share import LIMIT_MAX, SubmitterLimits

DEFAULT = "*"
_INT_TAG = "tag:yaml.org,2002:int"
_STR_TAG = "tag:yaml.org,2002:str"
_NULL_TAG = "tag:yaml.org,2002:null"


class LimitsError(ValueError):
    """A limits file that cannot be used; the message names the file and the line."""


def load(path: str | Path, flag_default: int = 0) -> SubmitterLimits:
    """The limits of the file at ``path``, with ``flag_default``
    (``--max-devices-per-submitter``, 0: none) as the default when it has no ``"*"``."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LimitsError(f"limits file {path}: cannot read it: {exc}") from None
    return parse(text, str(path), flag_default)


def parse(text: str, name: str = "limits file", flag_default: int = 0) -> SubmitterLimits:
    """``load`` on the file's text; ``name`` is what errors call the file."""
    names = _Reader(name).read(text)
    default = names.pop(DEFAULT, None)
    if default is not None and flag_default:
        raise LimitsError(
            f'{name}: "*" and --max-devices-per-submitter both set the default limit;'
            " give one of them"
        )
    if default is None and flag_default:
        default = flag_default
    return SubmitterLimits(default, names)


_SHAPE = 'a mapping "limits:" of name: devices'


class _Reader:
    """The file's node tree walked with each node's line at hand."""

    def __init__(self, name: str) -> None:
        self.name = name

    def bad(self, node: yaml.Node | int, what: str) -> LimitsError:
        line = node if isinstance(node, int) else node.start_mark.line + 1
        return LimitsError(f"{self.name} line {line}: {what}")

    def read(self, text: str) -> dict[str, int]:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.MarkedYAMLError as exc:
            mark = exc.problem_mark or exc.context_mark
            raise self.bad(mark.line + 1 if mark else 1, f"not YAML: {exc.problem}") from None
        except yaml.YAMLError as exc:
            raise LimitsError(f"{self.name}: not YAML: {exc}") from None
        if root is None:
            raise self.bad(1, f"the file is empty; expected {_SHAPE}")
        if not isinstance(root, yaml.MappingNode) or not root.value:
            raise self.bad(root, f"expected {_SHAPE}")
        for key, _ in root.value:
            if not (isinstance(key, yaml.ScalarNode) and key.value == "limits"):
                raise self.bad(key, f"unknown key {_shown(key)}; expected {_SHAPE}")
        if len(root.value) > 1:
            raise self.bad(root.value[1][0], '"limits" is given twice')
        body = root.value[0][1]
        if isinstance(body, yaml.ScalarNode) and body.tag == _NULL_TAG:
            return {}  # "limits:" with nothing under it: no name has a limit
        if not isinstance(body, yaml.MappingNode):
            raise self.bad(body, f"limits: expected name: devices pairs, got {_shown(body)}")
        return self._names(body)

    def _names(self, body: yaml.MappingNode) -> dict[str, int]:
        out: dict[str, int] = {}
        lines: dict[str, int] = {}
        for key, value in body.value:
            if not (isinstance(key, yaml.ScalarNode) and key.tag == _STR_TAG and key.value):
                raise self.bad(key, f"a name must be a non-empty string, got {_shown(key)}")
            who = key.value
            if bounds.utf8_len(who) > bounds.SUBMITTER.size:
                raise self.bad(key, f"a name is at most {bounds.SUBMITTER.size} bytes")
            if who in lines:
                raise self.bad(key, f"{who!r} is given twice (first on line {lines[who]})")
            out[who] = self._limit(value, who)
            lines[who] = key.start_mark.line + 1
        return out

    def _limit(self, node: yaml.Node, who: str) -> int:
        text = node.value if isinstance(node, yaml.ScalarNode) else ""
        whole = node.tag == _INT_TAG and text.isascii() and text.isdigit()
        if not whole or int(text) > LIMIT_MAX:
            raise self.bad(
                node,
                f"{who}: a limit is a whole number of devices in 0..{LIMIT_MAX},"
                f" got {_shown(node)}",
            )
        return int(text)


def _shown(node: yaml.Node) -> str:
    if isinstance(node, yaml.ScalarNode):
        return repr(node.value)
    return "a " + type(node).__name__.replace("Node", "").lower()


def describe(limits: SubmitterLimits) -> str:
    """The limits in a log line: ``alice 4, bob 2; everyone else 1``."""
    named = ", ".join(f"{who} {n}" for who, n in sorted(limits.names.items())) or "no names"
    rest = "no limit" if limits.default is None else str(limits.default)
    return f"{named}; everyone else {rest}"
