"""Refunds in Python, on the toolguard_sdk package; built with plain
`componentize-py componentize` (no flags).

- `refund` (irreversible): form-encoded POST /v1/refunds through the guard's
  `send`; the host mints the idempotency key, records the attempt before it
  leaves and replays the recorded outcome on a repeat.
- `refund_status` (read-only): GET /v1/refunds?payment_intent=... (`fetch`).
- the reconciler finds the refund whose metadata carries the attempt's key.

`print` goes to the host's log, tagged with the plugin; `time` and `random`
are real. The socket module is there (the toolchain links it) but sealed:
it can reach nothing.
"""

import random
import time
from typing import Annotated, Literal, TypedDict

from toolguard_sdk import Failed, Field, OutboundError, Reconciler, Request, Tool, config, found, not_found
from toolguard_sdk import reconciler, tool

__all__ = ["Reconciler", "Tool"]  # the component's exports

PaymentIntent = Annotated[str, Field(pattern="^pi_[A-Za-z0-9_]{1,64}$",
                                     description="The payment intent to refund, e.g. pi_123.")]


class Refund(TypedDict):
    refund_id: str
    status: str
    amount_cents: int
    payment_intent: str
    reason: str | None


class Status(TypedDict):
    payment_intent: str
    refunded_cents: int
    refunds: list[Refund]


def api_base() -> str:
    base = config("api_base")
    if base is None:
        raise Failed("the plugin setting `api_base` is not configured")
    return base.rstrip("/")


@tool(effect="irreversible")
def refund(payment_intent: PaymentIntent,
           amount_cents: Annotated[int, Field(minimum=1, maximum=100_000_000, description="Amount to refund, in cents.")],
           reason: Literal["duplicate", "fraudulent", "requested_by_customer"]) -> Refund:
    """Refunds part or all of a payment. Irreversible: every successful call moves money.
    If the outcome is reported unknown, do not call refund again: call refund_status first."""
    # Real time and randomness: a trace id for this invocation's log line.
    print(f"refund {payment_intent} at {time.time():.3f} trace {random.getrandbits(32):08x}")
    request = Request.post(f"{api_base()}/v1/refunds").form(
        {"payment_intent": payment_intent, "amount": str(amount_cents), "reason": reason})
    try:
        response = request.send()
    except OutboundError as e:
        if e.kind != "outcome-unknown":
            raise
        raise e.with_message(
            "The outcome of this refund is unknown: the payment provider may already have made it. "
            f"Do not call refund again. Call refund_status for payment intent {payment_intent} first, "
            f"and refund only if no matching refund is listed. (Host: {e.error.value.message})")
    if not response.ok:
        raise Failed(declined(response))
    return summary(response.json())


@tool(effect="read-only")
def refund_status(payment_intent: PaymentIntent) -> Status:
    """Lists the refunds of a payment intent with the total refunded. Read-only."""
    print(f"refund_status {payment_intent} at {time.time():.3f} trace {random.getrandbits(32):08x}")
    refunds = [summary(r) for r in list_refunds(api_base(), payment_intent)]
    refunded = sum(r["amount_cents"] for r in refunds if r["status"] not in ("failed", "canceled"))
    return {"payment_intent": payment_intent, "refunded_cents": refunded, "refunds": refunds}


@reconciler("refund")
def find_refund(args: dict, attempt):
    """Finds the refund whose metadata carries the attempt's key."""
    field = config("key_metadata_field") or "toolguard_key"
    def made_by(r: dict) -> bool:
        return (r.get("metadata") or {}).get(field) == attempt.key
    for r in list_refunds(api_base(), args["payment_intent"], until=made_by):
        if made_by(r):
            return found(r)
    return not_found()


# The most pages of 100 refunds one look-up reads, within the host's default
# budget of 16 outbound calls per invocation (max_outbound_calls); past it,
# it fails rather than answer from part of the list.
MAX_PAGES = 15


def list_refunds(base: str, payment_intent: str, until=lambda r: False) -> list[dict]:
    """The refunds of a payment intent, newest first: page after page (Stripe's
    has_more and starting_after) until `until` matches one or the list ends."""
    refunds: list[dict] = []
    seen: set[str] = set()
    for _ in range(MAX_PAGES):
        query = {"payment_intent": payment_intent, "limit": "100"}
        cursor = refunds[-1]["id"] if refunds else None
        if cursor:
            query["starting_after"] = cursor
        response = Request.get(f"{base}/v1/refunds", query).fetch()
        if not response.ok:
            raise Failed(declined(response))
        page = response.json()
        data = page.get("data", [])
        # A listing that does not move past its cursor cannot be read to its end.
        if any(r["id"] in seen for r in data) or (page.get("has_more") and not data):
            raise Failed(f"the provider's listing of {payment_intent} does not page past {cursor}")
        seen.update(r["id"] for r in data)
        refunds.extend(data)
        if not page.get("has_more") or any(until(r) for r in data):
            return refunds
    raise Failed(f"payment {payment_intent} has more than {MAX_PAGES * 100} refunds; not all of them were read")


def summary(refund: dict) -> Refund:
    return {"refund_id": refund["id"], "status": refund["status"], "amount_cents": refund["amount"],
            "payment_intent": refund["payment_intent"], "reason": refund.get("reason")}


def declined(response) -> str:
    try:
        error = response.json().get("error", {})
    except ValueError:
        error = {}
    return (f"the provider declined (HTTP {response.status}, {error.get('code', 'unknown')}): "
            f"{error.get('message', 'no message')}")
