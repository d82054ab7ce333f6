"""Write toolguard tools in Python.

A tool is a type-hinted function; its JSON Schema comes from the hints::

    from toolguard_sdk import Field, Tool, tool   # re-export Tool: the component's export

    @tool(effect="read-only")
    def greet(name: Annotated[str, Field(min_length=1)]) -> Greeting:
        "Greets someone by name."
        return {"greeting": f"Hello, {name}!"}

The only way out is the host's guard: `Request(...).send()` for side effects
(the host mints the idempotency key, records the attempt before it leaves and
replays a repeat) and `.fetch()` for reads. Build with plain
`componentize-py -d wit -w plugin componentize app -p . -p <this package's dir>`.
"""

from __future__ import annotations

import inspect
import json
from typing import Any, Callable, Literal, TypeVar

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import outbound, types

from .http import OutboundError, Request, Response
from .schema import Field, arguments_schema, result_schema

__all__ = ["Failed", "Field", "InvalidArgs", "OutboundError", "Reconciler", "Request", "Response", "Tool",
           "config", "found", "not_found", "reconciler", "still_unknown", "tool"]

Effect = Literal["read-only", "idempotent", "irreversible"]
_EFFECTS = {"read-only": types.Effect.READ_ONLY, "idempotent": types.Effect.IDEMPOTENT,
            "irreversible": types.Effect.IRREVERSIBLE}
F = TypeVar("F", bound=Callable[..., Any])


class Failed(Exception):
    """The tool ran and failed (e.g. the provider declined); the message goes to the model."""


class InvalidArgs(Exception):
    """The arguments are well-formed but make no sense to the tool."""


class _Registered:
    def __init__(self, fn: Callable[..., Any], effect: Effect, name: str, description: str) -> None:
        self.fn, self.name, self.description = fn, name, description
        self.effect = _EFFECTS[effect]
        self.input_schema = json.dumps(arguments_schema(fn))
        output = result_schema(fn)
        self.output_schema = json.dumps(output) if output is not None else None


_TOOLS: dict[str, _Registered] = {}
_RECONCILERS: dict[str, Callable[[dict[str, Any], types.Attempt], types.Reconciliation]] = {}


def tool(effect: Effect, name: str | None = None, description: str | None = None) -> Callable[[F], F]:
    """Registers a function as a tool with the effect class it claims.

    Its name defaults to the function's, its description to the docstring,
    its input schema to the parameters' type hints (a parameter with a
    default is optional) and its output schema to the return hint.
    """
    if effect not in _EFFECTS:
        raise ValueError(f"effect must be one of {sorted(_EFFECTS)}, not {effect!r}")

    def register(fn: F) -> F:
        registered = _Registered(fn, effect, name or fn.__name__, description or inspect.getdoc(fn) or "")
        if registered.name in _TOOLS:
            raise ValueError(f"two tools are named {registered.name!r}")
        _TOOLS[registered.name] = registered
        return fn

    return register


def reconciler(tool_name: str) -> Callable[[F], F]:
    """Registers `fn(args, attempt)` as the look-up for unknown outcomes of `tool_name`.

    It returns `found(...)`, `not_found()` or `still_unknown(why)`; only
    `fetch` works inside it (`send` is denied). Export `Reconciler` too.
    """

    def register(fn: F) -> F:
        _RECONCILERS[tool_name] = fn
        return fn

    return register


def config(name: str) -> str | None:
    """A non-secret setting from the host config for this plugin, if set. Secrets never reach a plugin."""
    return outbound.config(name)


def found(body: Any, status: int = 200) -> types.Reconciliation:
    """The provider has it: `body` (JSON-serialisable) is what the request would have returned."""
    return types.Reconciliation_Found(types.Response(
        status=status, headers=[types.Header(name="content-type", value="application/json")],
        body=json.dumps(body).encode()))


def not_found() -> types.Reconciliation:
    """The provider has no record of the attempt."""
    return types.Reconciliation_NotFound()


def still_unknown(why: str) -> types.Reconciliation:
    """The look-up could not tell; why."""
    return types.Reconciliation_StillUnknown(why)


class Tool(exports.Tool):
    """The component's `tool` export: every `@tool` function. Import it into your app module."""

    def describe(self) -> list[types.ToolSpec]:
        return [types.ToolSpec(name=t.name, description=t.description, input_schema=t.input_schema,
                               output_schema=t.output_schema, effect=t.effect) for t in _TOOLS.values()]

    def invoke(self, tool_name: str, args_json: str) -> str:
        registered = _TOOLS.get(tool_name)
        if registered is None:
            raise Err(types.ToolError_InvalidArgs(f"unknown tool {tool_name}"))
        try:
            result = registered.fn(**json.loads(args_json))
        except Failed as e:
            raise Err(types.ToolError_Failed(str(e)))
        except InvalidArgs as e:
            raise Err(types.ToolError_InvalidArgs(str(e)))
        except OutboundError as e:
            # The host's verdict, passed on unchanged so the model sees its exact kind.
            raise Err(types.ToolError_Outbound(e.error))
        return json.dumps(result)


def _reconcile(tool_name: str, args_json: str, attempt: types.Attempt) -> types.Reconciliation:
    look_up = _RECONCILERS.get(tool_name)
    if look_up is None:
        return still_unknown(f"`{tool_name}` has no reconciler")
    try:
        return look_up(json.loads(args_json), attempt)
    except (Failed, OutboundError) as e:
        return still_unknown(f"the look-up failed: {e}")


# Only the world `reconciling-plugin` has this export; in `plugin` there is nothing to define.
if hasattr(exports, "Reconciler"):

    class Reconciler(exports.Reconciler):  # type: ignore[no-redef]
        """The component's `reconciler` export: every `@reconciler` function."""

        def reconcile(self, tool_name: str, args_json: str, attempt: types.Attempt) -> types.Reconciliation:
            return _reconcile(tool_name, args_json, attempt)
