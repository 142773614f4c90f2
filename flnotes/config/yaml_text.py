"""YAML as flnotes reads a user's files (sweep grids, ``run --config``): ``yaml.safe_load``
without its four surprises.

- A key given twice in one mapping is an error (:class:`DuplicateKey`); PyYAML keeps the last
  silently. A merge key's keys (``<<: *base``) may still be overridden by the mapping's own.
- A key that is a list or a mapping (``[a, b]: 1``) is an error naming its line, not a
  TypeError from deep inside PyYAML.
- Only ``true``/``false`` are booleans, as in YAML 1.2 and JSON: YAML 1.1 also reads ``on``,
  ``off``, ``yes``, ``no`` (and ``y``, ``n`` in some readers) as booleans, which turns
  ``compile: off`` into False and a run refuses it as "not a string".
- ``1e-3`` is a number, as in Python and JSON (YAML 1.1 wants a dot: ``1.0e-3``).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

BOOL_TAG = "tag:yaml.org,2002:bool"
MERGE_TAG = "tag:yaml.org,2002:merge"


class DuplicateKey(yaml.YAMLError):
    """A key given twice in one mapping; ``first`` and ``again`` are 1-based lines (None
    where the text has none: JSON read by json)."""

    def __init__(self, key, first: int | None = None, again: int | None = None) -> None:
        lines = f" (lines {first} and {again})" if first and again else ""
        super().__init__(f"key {key!r} given twice in one mapping{lines}; YAML would keep "
                         "only the last: remove one")
        self.key, self.first, self.again = key, first, again


class StrictLoader(yaml.SafeLoader):
    """yaml.SafeLoader with the module's rules."""


# YAML 1.2's booleans only: the resolvers of SafeLoader without its bool patterns, then one
# for true/false. (Assigned, not appended: SafeLoader's own table stays as it is.)
StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
StrictLoader.add_implicit_resolver(BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"),
                                   list("tTfF"))
StrictLoader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(
    r"^[-+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)[eE][-+]?[0-9]+$"), list("-+0123456789."))


def _mapping(loader: StrictLoader, node: yaml.MappingNode, deep: bool = False):
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        if key_node.tag == MERGE_TAG:
            continue
        key = loader.construct_object(key_node, deep=True)
        line = key_node.start_mark.line + 1
        if isinstance(key, (list, dict)):
            raise yaml.constructor.ConstructorError(
                None, None, f"a key must be a name or a number, not a "
                f"{'list' if isinstance(key, list) else 'mapping'}", key_node.start_mark)
        if key in seen:
            raise DuplicateKey(key, seen[key], line)
        seen[key] = line
    return loader.construct_mapping(node, deep=deep)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def read_yaml(text: str) -> Any:
    """The YAML text's value by the module's rules (DuplicateKey or another yaml.YAMLError
    when it breaks one)."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader)
