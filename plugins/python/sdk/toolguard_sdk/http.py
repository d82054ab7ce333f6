"""Requests through the guard: `send` for side effects, `fetch` for reads."""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import urlencode

from componentize_py_types import Err
from wit_world.imports import outbound, types


class OutboundError(Exception):
    """The host did not deliver a response: `kind` says why, `error` is the contract's value.

    Kinds: denied, conflict, outcome-unknown, held, transport, invalid. For
    `outcome-unknown` the request may have taken effect: never repeat it
    blindly. A tool that lets this propagate passes it on unchanged.
    """

    def __init__(self, error: Any) -> None:
        self.error = error
        variant = type(error).__name__.removeprefix("OutboundError_")
        self.kind = re.sub(r"(?<!^)([A-Z])", r"-\1", variant).lower()
        value = getattr(error, "value", None)
        message = getattr(value, "message", value)
        super().__init__(f"{self.kind}: {message}")

    def with_message(self, message: str) -> OutboundError:
        """The same error with its message (for outcome-unknown and held) replaced by `message`."""
        value = self.error.value
        if hasattr(value, "message"):
            value.message = message
        return self


class Response:
    """The downstream's answer, as the host received (or recorded) it."""

    def __init__(self, raw: types.Response) -> None:
        self.status: int = raw.status
        self.headers: dict[str, str] = {h.name.lower(): h.value for h in raw.headers}
        self.body: bytes = bytes(raw.body)

    @property
    def ok(self) -> bool:
        """Whether the status is 2xx."""
        return 200 <= self.status < 300

    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)

    def text(self) -> str:
        """The body as UTF-8 text."""
        return self.body.decode("utf-8", "replace")


class Request:
    """An HTTP request to hand to the host. It never carries a key or credentials: the host adds those."""

    def __init__(self, method: str, url: str) -> None:
        self.method, self.url = method, url
        self.headers: list[tuple[str, str]] = []
        self.body = b""

    @classmethod
    def get(cls, url: str, query: dict[str, str] | None = None) -> Request:
        """A GET of `url`, with `query` form-encoded onto it."""
        return cls("GET", url).query(query or {})

    @classmethod
    def post(cls, url: str) -> Request:
        """A POST to `url`."""
        return cls("POST", url)

    def query(self, pairs: dict[str, str]) -> Request:
        """Appends `pairs` to the URL's query, form-encoded."""
        if pairs:
            self.url += ("&" if "?" in self.url else "?") + urlencode(pairs)
        return self

    def header(self, name: str, value: str) -> Request:
        """Adds a header (not the key header, not Authorization: the host owns those)."""
        self.headers.append((name, value))
        return self

    def json(self, body: Any) -> Request:
        """Sets a JSON body and its Content-Type."""
        return self._body("application/json", json.dumps(body).encode())

    def form(self, pairs: dict[str, str]) -> Request:
        """Sets a form-encoded body, as Stripe-like APIs take."""
        return self._body("application/x-www-form-urlencoded", urlencode(pairs).encode())

    def _body(self, content_type: str, body: bytes) -> Request:
        self.headers = [(n, v) for n, v in self.headers if n.lower() != "content-type"]
        self.headers.append(("Content-Type", content_type))
        self.body = body
        return self

    def _wit(self) -> types.Request:
        return types.Request(method=self.method, url=self.url, body=self.body,
                             headers=[types.Header(name=n, value=v) for n, v in self.headers])

    def send(self) -> Response:
        """Sends it under the guard (keyed, recorded before it leaves; a repeat replays). Raises OutboundError."""
        try:
            return Response(outbound.send(self._wit()))
        except Err as e:
            raise OutboundError(e.value) from None

    def fetch(self) -> Response:
        """Fetches it (GET/HEAD only): inside the grants, not keyed, not recorded. Raises OutboundError."""
        try:
            return Response(outbound.fetch(self._wit()))
        except Err as e:
            raise OutboundError(e.value) from None
