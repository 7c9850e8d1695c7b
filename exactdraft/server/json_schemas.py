"""JSON schemas read as the OpenAI API reads them under `strict`: an object that lists its
properties has those properties only.

Invariant: `closed(schema)` returns a new schema (the one given is not changed) in which every
object schema that lists `properties` and says nothing of `additionalProperties` (nor of
`unevaluatedProperties`) has `"additionalProperties": false`; everything else is as given. An
object without `properties` ({"type": "object"}: any object) stays open, and so does a member
of `allOf`, whose siblings may declare the other keys (the objects nested inside it are closed
like any other). The server applies it to the schemas of tool calls it constrains and of a
`strict` response_format, unless a request sends `"closed_objects": false`.
"""

from __future__ import annotations

from typing import Any

# Keywords whose value is a schema, a list of schemas, or a map of name -> schema.
ONE_SCHEMA = ("items", "additionalItems", "contains", "not", "if", "then", "else",
              "propertyNames", "additionalProperties", "unevaluatedItems",
              "unevaluatedProperties")
SCHEMA_LISTS = ("anyOf", "oneOf", "prefixItems", "items")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def closed(schema: Any) -> Any:
    """`schema` with its listed-property objects closed (see the module invariant)."""
    return _closed(schema, close_here=True)


def _closed(node: Any, close_here: bool) -> Any:
    if not isinstance(node, dict):
        return node
    out = dict(node)
    for key in ONE_SCHEMA:
        if isinstance(out.get(key), dict):
            out[key] = _closed(out[key], True)
    for key in SCHEMA_LISTS:
        if isinstance(out.get(key), list):
            out[key] = [_closed(member, True) for member in out[key]]
    if isinstance(out.get("allOf"), list):
        out["allOf"] = [_closed(member, False) for member in out["allOf"]]
    for key in SCHEMA_MAPS:
        if isinstance(out.get(key), dict):
            out[key] = {name: _closed(member, True) for name, member in out[key].items()}
    if close_here and isinstance(out.get("properties"), dict) and \
            "additionalProperties" not in out and "unevaluatedProperties" not in out:
        out["additionalProperties"] = False
    return out
