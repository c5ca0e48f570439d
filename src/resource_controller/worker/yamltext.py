"""Reading ``worker.yaml`` as YAML while keeping the literal text of label values."""

from __future__ import annotations

from typing import Any

import yaml


def read(text: str) -> Any:
    """``3`` must become ``"3"`` and ``1.50`` stay ``"1.50"`` in ``devices[].labels``, which a
    plain load cannot promise: label mappings are read from the node tree."""
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


def error_text(path: str, exc: yaml.YAMLError) -> str:
    """``<path>: line L, column C: <problem> (<context>)``, on one line."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        text = f"{path}: line {mark.line + 1}, column {mark.column + 1}: {exc.problem}"
        if exc.context:
            text += f" ({exc.context})"
        return " ".join(text.split())
    return " ".join(str(exc).split())
