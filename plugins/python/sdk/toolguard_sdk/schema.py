"""JSON Schemas (draft 2020-12) from Python type hints.

Pure standard library, so it runs under componentize-py and under any
CPython. Supported: str, int, float, bool, None, Any, list[T], tuple[T, ...],
dict[str, T], Literal[...], unions (`A | B`, Optional), TypedDict, and
Annotated[T, Field(...)] for constraints and descriptions.
"""

from __future__ import annotations

import inspect
import types as pytypes
import typing
from typing import Any, Callable


class Field:
    """JSON Schema keywords for one value, used as `Annotated[T, Field(...)]`.

    Keyword names are JSON Schema's own, with Python spelling:
    `min_length=1` becomes `minLength`, `pattern`, `minimum`, `maximum`,
    `description`, ... pass straight through.
    """

    def __init__(self, **keywords: Any) -> None:
        self.keywords = {_camel(k): v for k, v in keywords.items()}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word.capitalize() for word in rest)


_SCALARS: dict[Any, dict[str, Any]] = {
    str: {"type": "string"},
    int: {"type": "integer"},
    float: {"type": "number"},
    bool: {"type": "boolean"},
    type(None): {"type": "null"},
    None: {"type": "null"},
}


def schema_of(hint: Any, strict: bool = True) -> dict[str, Any]:
    """The schema of one type hint. `strict` refuses unknown keys in TypedDicts (for arguments)."""
    if hint in _SCALARS:
        return dict(_SCALARS[hint])
    if hint is Any or hint is object:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Annotated:
        schema = schema_of(args[0], strict)
        for extra in args[1:]:
            if isinstance(extra, Field):
                schema.update(extra.keywords)
        return schema
    if origin is typing.Literal:
        schema: dict[str, Any] = {"enum": list(args)}
        kinds = {type(a) for a in args}
        if len(kinds) == 1 and next(iter(kinds)) in _SCALARS:
            schema = {**_SCALARS[next(iter(kinds))], **schema}
        return schema
    if origin in (typing.Union, pytypes.UnionType):
        return {"anyOf": [schema_of(a, strict) for a in args]}
    if origin in (list, typing.List, set, frozenset):
        return {"type": "array", "items": schema_of(args[0], strict) if args else {}}
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": schema_of(args[0], strict)}
        return {"type": "array", "prefixItems": [schema_of(a, strict) for a in args], "items": False}
    if origin is dict or hint is dict:
        value = schema_of(args[1], strict) if len(args) == 2 else {}
        return {"type": "object", "additionalProperties": value}
    if hint is list:
        return {"type": "array"}
    if typing.is_typeddict(hint):
        hints = typing.get_type_hints(hint, include_extras=True)
        schema = {
            "type": "object",
            "properties": {name: schema_of(h, strict) for name, h in hints.items()},
            "required": [name for name in hints if name in hint.__required_keys__],
        }
        if strict:
            schema["additionalProperties"] = False
        return schema
    raise TypeError(f"no JSON Schema for the type hint {hint!r}: use str, int, float, bool, list, dict, "
                    "Literal, a union, a TypedDict or Annotated[..., Field(...)]")


def arguments_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The input schema of a tool function: one property per parameter, strict."""
    hints = typing.get_type_hints(fn, include_extras=True)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise TypeError(f"{fn.__name__}: a tool takes named parameters, not *{name}")
        if name not in hints:
            raise TypeError(f"{fn.__name__}: parameter `{name}` needs a type hint (it becomes the schema)")
        schema = schema_of(hints[name])
        if param.default is param.empty:
            required.append(name)
        elif param.default is not None:
            schema["default"] = param.default
        properties[name] = schema
    return {"type": "object", "properties": properties, "required": required, "additionalProperties": False}


def result_schema(fn: Callable[..., Any]) -> dict[str, Any] | None:
    """The output schema of a tool function, when its return hint is an object type."""
    hint = typing.get_type_hints(fn, include_extras=True).get("return")
    if hint is None:
        return None
    schema = schema_of(hint, strict=False)
    return schema if schema.get("type") == "object" else None
