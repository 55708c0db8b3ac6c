"""JSON Schema, read the way the governance commands need it: local ``$ref`` resolution, a short spelling of
types, the inputs of a tool and the field paths of its result. Pure; shared by profiles and contracts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

#: Output schemas are walked this deep for field paths; ``$ref`` chains are followed this many hops.
MAX_FIELD_DEPTH = 4


def canonical_json(value: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept: equal values give equal text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(value: Any) -> str:
    return "sha256:" + hashlib.sha256(canonical_json(value).encode("utf-8", "surrogatepass")).hexdigest()


def schema_type(schema: Any) -> str:
    """A short, stable spelling of a JSON Schema's type: ``string``, ``integer|null``, ``array<string>``,
    ``enum``, ``ref:#/$defs/X``; ``any`` when the schema does not say."""
    if not isinstance(schema, Mapping):
        return "any"
    kind = schema.get("type")
    if isinstance(kind, list):
        names = sorted({str(k) for k in kind})
        return "|".join(names) if names else "any"
    if isinstance(kind, str):
        if kind == "array":
            return f"array<{schema_type(schema.get('items'))}>"
        return kind
    for combinator in ("anyOf", "oneOf"):
        members = schema.get(combinator)
        if isinstance(members, list) and members:
            return "|".join(sorted({schema_type(m) for m in members}))
    if isinstance(schema.get("$ref"), str):
        return f"ref:{schema['$ref']}"
    if "enum" in schema:
        return "enum"
    if "const" in schema:
        return "const"
    return "any"


def properties(schema: Any) -> Mapping[str, Any]:
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    return props if isinstance(props, Mapping) else {}


def resolve(schema: Any, root: Any) -> Any:
    """A local ``$ref`` (``#/$defs/X``, ``#/definitions/X``) replaced by its target, a few hops at most."""
    for _ in range(MAX_FIELD_DEPTH):
        ref = schema.get("$ref") if isinstance(schema, Mapping) else None
        if not isinstance(ref, str) or not ref.startswith("#/"):
            return schema
        target: Any = root
        for part in ref[2:].split("/"):
            target = target.get(part) if isinstance(target, Mapping) else None
        if not isinstance(target, Mapping):
            return schema
        schema = target
    return schema


def number(value: Any) -> int | float | None:
    """A JSON number (never a bool), else None."""
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def input_fields(tool: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The top-level inputs of a tool: name -> {type, required}, plus ``maximum`` and ``has_default`` when the
    schema declares them (what makes a limit input bound a result)."""
    schema = tool.get("inputSchema")
    required = schema.get("required") if isinstance(schema, Mapping) else None
    required_names = {str(r) for r in required} if isinstance(required, list) else set()
    out: dict[str, dict[str, Any]] = {}
    for name, prop in properties(schema).items():
        prop = resolve(prop, schema)
        entry: dict[str, Any] = {"type": schema_type(prop), "required": str(name) in required_names}
        if isinstance(prop, Mapping):
            if number(prop.get("maximum")) is not None:
                entry["maximum"] = prop["maximum"]
            if "default" in prop:
                entry["has_default"] = True
        out[str(name)] = entry
    return out


def _output_nodes(tool: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Every field of a tool's outputSchema as (path, resolved schema), four levels deep."""
    found: list[tuple[str, Any]] = []
    root = tool.get("outputSchema")

    def walk(schema: Any, prefix: str, depth: int) -> None:
        for name, prop in properties(resolve(schema, root)).items():
            path = f"{prefix}{name}"
            prop = resolve(prop, root)
            found.append((path, prop))
            if depth >= MAX_FIELD_DEPTH or not isinstance(prop, Mapping):
                continue
            if prop.get("type") == "array":
                walk(prop.get("items"), f"{path}[].", depth + 1)
            else:
                walk(prop, f"{path}.", depth + 1)

    walk(root, "", 1)
    return found


def output_fields(tool: Mapping[str, Any]) -> dict[str, str]:
    """The fields of a tool's outputSchema as paths -> type: ``total``, ``issues[].title``, ``owner.login``."""
    return {path: schema_type(prop) for path, prop in _output_nodes(tool)}


def output_max_lengths(tool: Mapping[str, Any]) -> dict[str, int]:
    """The output fields that declare a ``maxLength``: path -> maxLength."""
    return {
        path: prop["maxLength"]
        for path, prop in _output_nodes(tool)
        if isinstance(prop, Mapping) and isinstance(prop.get("maxLength"), int)
        and not isinstance(prop.get("maxLength"), bool)
    }
