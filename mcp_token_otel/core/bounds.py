"""What bounds a tool's result, read from its schemas: the limit inputs a caller passes (``limit``, ``head``,
``max_length``, ...) and the worst case of its outputSchema, with every unbounded value named.

A string that can carry content (no ``maxLength``, ``enum``, ``const`` or ``format``, and a content-like name,
or the result's only field unless its name says it is short) and an array without ``maxItems`` are unbounded
at any depth; so is a field that declares no properties or no type. Pure.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .estimation import estimate_tokens
from .schemas import number, properties, resolve

#: Tokens assumed for one field's value when only its name is known.
VALUE_TOKENS = 8
#: Tokens per field value under the compact rule.
COMPACT_VALUE_TOKENS = 5
#: Bytes (or characters) per token used to turn a byte or character cap into tokens (dense JSON: conservative).
BYTES_PER_TOKEN = 3.5
# Names are compared by their last word, lower case: "fileContent", "raw_text" and "page-body" end in content words.
_CONTENT_WORDS = frozenset({
    "content", "contents", "text", "body", "data", "html", "markdown", "md", "xml", "csv", "stdout", "stderr",
    "output", "result", "raw", "diff", "patch", "log", "logs", "document", "page", "transcript", "payload", "blob",
})
_SHORT_WORDS = frozenset({
    "id", "uuid", "name", "date", "time", "timestamp", "at", "key", "slug", "email", "status", "state", "type",
    "kind", "version", "url", "uri", "path", "sha", "hash", "etag", "cursor", "timezone", "language", "mime",
})
# Limit inputs, by name with case, "_" and "-" removed: item counts, and characters (or bytes) of the result.
_ITEM_LIMITS = frozenset({
    "limit", "maxresults", "perpage", "pagesize", "head", "tail", "count", "topk", "top", "first", "last",
    "numresults", "maxitems", "maxcount", "maxentries", "maxlines", "lines", "size",
})
_CHAR_LIMITS = frozenset({"length", "maxlength", "maxchars", "maxcharacters", "maxbytes", "maxsize"})
_TOKEN_LIMITS = frozenset({"maxtokens"})
_WORD = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def limit_kind(name: str) -> str | None:
    """``items``, ``chars`` or ``tokens`` for an input that limits a result by its name, else None."""
    key = re.sub(r"[_\-\s]", "", name).lower()
    if key in _ITEM_LIMITS:
        return "items"
    if key in _CHAR_LIMITS:
        return "chars"
    return "tokens" if key in _TOKEN_LIMITS else None


def _last_word(name: str) -> str:
    words = _WORD.findall(name)
    return words[-1].lower() if words else name.lower()


def key_tokens(name: str, rule: str) -> int:
    return math.ceil(len(name) / 4) if rule == "compact" else estimate_tokens(f'"{name}":')


def value_tokens(rule: str) -> int:
    return COMPACT_VALUE_TOKENS if rule == "compact" else VALUE_TOKENS


@dataclass(frozen=True, slots=True)
class LimitInput:
    """An input that limits the result: its name, kind (items, chars, tokens), declared maximum, and whether an
    omitted value still bounds (required, or a default)."""

    name: str
    kind: str
    maximum: int | None
    binding: bool

    @property
    def effective(self) -> bool:
        return self.binding and self.maximum is not None

    @property
    def gap(self) -> str:
        """Why it does not bound, for the reason line (singular: 'has no maximum and no default')."""
        if self.maximum is None:
            return "has no maximum" if self.binding else "has no maximum and no default"
        return "is optional without a default"


def limit_inputs(tool: Mapping[str, Any]) -> list[LimitInput]:
    """The tool's limit inputs (``limit_kind``) that are numbers, in schema order."""
    schema = tool.get("inputSchema")
    required = schema.get("required") if isinstance(schema, Mapping) else None
    required_names = {str(r) for r in required} if isinstance(required, list) else set()
    found: list[LimitInput] = []
    for name, prop in properties(schema).items():
        prop = resolve(prop, schema)
        kind = limit_kind(str(name))
        if kind is None or not isinstance(prop, Mapping) or prop.get("type") not in ("integer", "number"):
            continue
        maximum = number(prop.get("maximum"))
        exclusive = number(prop.get("exclusiveMaximum"))
        if maximum is None and exclusive is not None:
            maximum = math.ceil(exclusive) - 1
        binding = str(name) in required_names or "default" in prop
        found.append(LimitInput(str(name), kind, None if maximum is None else math.floor(maximum), binding))
    return found


#: Deeper than this, a value is costed as a short one (a recursive schema must end).
_MAX_DEPTH = 8


class ResultWalk:
    """The worst case of a result from its outputSchema: tokens, or None with the causes recorded."""

    def __init__(self, root: Any, rule: str) -> None:
        self.root = root
        self.rule = rule
        self.value = value_tokens(rule)
        #: (kind, path) of every unbounded value: kind is "string", "array", "object" or "any" (no type).
        self.causes: list[tuple[str, str]] = []
        #: The causes an item limit input can bound: the result's own collections and content strings.
        self.top_causes: list[str] = []
        self.bounds: list[str] = []

    def cause(self, kind: str, path: str) -> None:
        self.causes.append((kind, path))

    def is_content(self, schema: Mapping[str, Any], name: str, only: bool) -> bool:
        """A string that can carry a document: no bound, no enum or format, and a content-like name (or the
        result's only field, unless its name says it is short)."""
        if any(k in schema for k in ("maxLength", "enum", "const", "format")):
            return False
        word = _last_word(name)
        return word in _CONTENT_WORDS or (only and word not in _SHORT_WORDS)

    def node(self, schema: Any, path: str, depth: int, only: bool = False) -> int | None:
        """Tokens of one value (its key not included), None when nothing bounds it."""
        schema = resolve(schema, self.root)
        if depth > _MAX_DEPTH or (schema is None and path.endswith("[]")):  # array items left open: short values
            return self.value
        if not isinstance(schema, Mapping):
            self.cause("any", path)
            return None
        for combinator in ("anyOf", "oneOf"):
            members = schema.get(combinator)
            if isinstance(members, list) and members:
                costs = [self.node(m, path, depth + 1, only) for m in members]
                return None if any(c is None for c in costs) else max(c for c in costs if c is not None)
        kinds = schema.get("type")
        kinds = [k for k in kinds if k != "null"] if isinstance(kinds, list) else [kinds]
        kind = kinds[0] if len(kinds) == 1 else ("object" if "properties" in schema else "array" if "items" in
                                                  schema else None if not kinds else "many")
        if kind == "many":
            costs = [self.node({**schema, "type": k}, path, depth, only) for k in kinds]
            return None if any(c is None for c in costs) else max(c for c in costs if c is not None)
        if kind is None and ("enum" in schema or "const" in schema):
            return self.value
        if kind == "string":
            return self.string(schema, path, only)
        if kind == "array":
            return self.array(schema, path, depth, schema.get("maxItems"))
        if kind == "object":
            return self.object(schema, path, depth)
        if kind is None:
            self.cause("any", path)
            return None
        return self.value  # number, integer, boolean, null

    def string(self, schema: Mapping[str, Any], path: str, only: bool) -> int | None:
        max_length = schema.get("maxLength")
        if isinstance(max_length, int) and not isinstance(max_length, bool):
            self.bounds.append(f'"{path}" maxLength {max_length:,}')
            return max(self.value, math.ceil(max_length / BYTES_PER_TOKEN) + 2)
        if self.is_content(schema, path.rsplit(".", 1)[-1].removesuffix("[]"), only):
            self.cause("string", path)
            return None
        return self.value

    def array(self, schema: Mapping[str, Any], path: str, depth: int, count: Any) -> int | None:
        counted = isinstance(count, int) and not isinstance(count, bool) and count >= 0
        if not counted:
            self.cause("array", path)
        item = self.node(schema.get("items"), f"{path}[]", depth + 1)  # its own causes too
        return None if item is None or not counted else 2 + count * (item + 1)

    def object(self, schema: Mapping[str, Any], path: str, depth: int) -> int | None:
        props = properties(schema)
        if not props and schema.get("additionalProperties") is not False:
            self.cause("object", path)
            return None
        total: int | None = 2
        for name, prop in props.items():
            cost = self.node(prop, f"{path}.{name}" if path else str(name), depth + 1)
            total = None if total is None or cost is None else total + key_tokens(str(name), self.rule) + cost
        return total

    def result(self, schema: Mapping[str, Any], item_limit: LimitInput | None) -> int | None:
        """The result's items: a collection (its arrays, ``limit`` items each, keys in the envelope) or one
        object. An item limit input bounds the result's own arrays and content strings."""
        props = {str(k): resolve(v, self.root) for k, v in properties(schema).items()}
        only = len(props) == 1
        arrays = [k for k, v in props.items() if isinstance(v, Mapping) and v.get("type") == "array"]
        total: int | None = 0 if arrays else 2
        for name, prop in props.items():
            cost: int | None
            if name in arrays:
                count = prop.get("maxItems")
                if count is None and item_limit is not None:
                    count = item_limit.maximum
                    self.bounds.append(f'"{name}" limited by input "{item_limit.name}" (maximum {count:,})')
                elif count is None:
                    self.top_causes.append(name)
                elif isinstance(count, int):
                    self.bounds.append(f'"{name}" maxItems {count:,}')
                cost = self.array(prop, name, 1, count)
                cost = None if cost is None else cost - 2 - (count if isinstance(count, int) else 0)
            elif isinstance(prop, Mapping) and prop.get("type") == "string" and self.is_content(prop, name, only):
                if item_limit is None or item_limit.maximum is None:
                    self.top_causes.append(name)
                    self.cause("string", name)
                    cost = None
                else:  # head/tail: lines of a text, each a typical value
                    cost = key_tokens(name, self.rule) + item_limit.maximum * self.value
                    self.bounds.append(f'"{name}" limited by input "{item_limit.name}" '
                                       f"(maximum {item_limit.maximum:,})")
            else:
                value = self.node(prop, name, 1, only)
                cost = None if value is None else key_tokens(name, self.rule) + value
            total = None if total is None or cost is None else total + cost
        return total
