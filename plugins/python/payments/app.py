"""Refunds in Python: toolguard's payments example, built with plain
`componentize-py componentize` (no flags).

- `refund` (irreversible): form-encoded POST /v1/refunds through
  `outbound.send`; the host mints the idempotency key, records the attempt
  before it leaves and replays the recorded outcome on a repeat.
- `refund_status` (read-only): GET /v1/refunds?payment_intent=... through
  `outbound.fetch`.
- `reconcile`: finds the refund whose metadata carries the attempt's key.

`print` goes to the host's log, tagged with the plugin; `time` and `random`
are real. The socket module is there (the toolchain links it) but sealed:
it can reach nothing.
"""

import json
import random
import time
from urllib.parse import urlencode

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import outbound, types

PAYMENT_INTENT = {"type": "string", "pattern": "^pi_[A-Za-z0-9_]{1,64}$",
                  "description": "The payment intent to refund, e.g. pi_123."}
REFUND = {
    "type": "object",
    "properties": {
        "refund_id": {"type": "string"},
        "status": {"type": "string"},
        "amount_cents": {"type": "integer"},
        "payment_intent": {"type": "string"},
        "reason": {"type": ["string", "null"]},
    },
    "required": ["refund_id", "status", "amount_cents", "payment_intent"],
}


def spec(name, description, effect, properties, output):
    schema = {"type": "object", "properties": properties,
              "required": list(properties), "additionalProperties": False}
    return types.ToolSpec(name=name, description=description, input_schema=json.dumps(schema),
                          output_schema=json.dumps(output), effect=effect)


def failed(message):
    return Err(types.ToolError_Failed(message))


class Tool(exports.Tool):
    def describe(self):
        return [
            spec("refund",
                 "Refunds part or all of a payment. Irreversible: every successful call moves money. "
                 "If the outcome is reported unknown, do not call refund again: call refund_status first.",
                 types.Effect.IRREVERSIBLE,
                 {"payment_intent": PAYMENT_INTENT,
                  "amount_cents": {"type": "integer", "minimum": 1, "maximum": 100000000},
                  "reason": {"type": "string", "enum": ["duplicate", "fraudulent", "requested_by_customer"]}},
                 REFUND),
            spec("refund_status",
                 "Lists the refunds of a payment intent with the total refunded. Read-only.",
                 types.Effect.READ_ONLY,
                 {"payment_intent": PAYMENT_INTENT},
                 {"type": "object", "required": ["payment_intent", "refunded_cents", "refunds"],
                  "properties": {"payment_intent": {"type": "string"}, "refunded_cents": {"type": "integer"},
                                 "refunds": {"type": "array", "items": REFUND}}}),
        ]

    def invoke(self, tool_name, args_json):
        args = json.loads(args_json)
        # Real time and randomness: a trace id for this invocation's log line.
        print(f"{tool_name} {args['payment_intent']} at {time.time():.3f} trace {random.getrandbits(32):08x}")
        base = outbound.config("api_base")
        if base is None:
            raise failed("the plugin setting `api_base` is not configured")
        base = base.rstrip("/")
        if tool_name == "refund":
            return json.dumps(refund(base, args))
        if tool_name == "refund_status":
            return json.dumps(status(base, args["payment_intent"]))
        raise Err(types.ToolError_InvalidArgs(f"unknown tool {tool_name}"))


def refund(base, args):
    body = urlencode({"payment_intent": args["payment_intent"], "amount": str(args["amount_cents"]),
                      "reason": args["reason"]}).encode()
    request = types.Request(method="POST", url=f"{base}/v1/refunds", body=body,
                            headers=[types.Header(name="Content-Type", value="application/x-www-form-urlencoded")])
    try:
        response = outbound.send(request)
    except Err as e:
        # Pass the host's verdict on unchanged (outcome unknown, held, denied...).
        raise Err(types.ToolError_Outbound(e.value))
    if 200 <= response.status < 300:
        return summary(json.loads(bytes(response.body)))
    raise failed(declined(response))


def list_refunds(base, payment_intent):
    query = urlencode({"payment_intent": payment_intent, "limit": "100"})
    try:
        response = outbound.fetch(types.Request(method="GET", url=f"{base}/v1/refunds?{query}", headers=[], body=b""))
    except Err as e:
        raise Err(types.ToolError_Outbound(e.value))
    if not 200 <= response.status < 300:
        raise failed(declined(response))
    return json.loads(bytes(response.body)).get("data", [])


def status(base, payment_intent):
    refunds = [summary(r) for r in list_refunds(base, payment_intent)]
    refunded = sum(r["amount_cents"] for r in refunds if r["status"] not in ("failed", "canceled"))
    return {"payment_intent": payment_intent, "refunded_cents": refunded, "refunds": refunds}


def summary(refund):
    return {"refund_id": refund["id"], "status": refund["status"], "amount_cents": refund["amount"],
            "payment_intent": refund["payment_intent"], "reason": refund.get("reason")}


def declined(response):
    try:
        error = json.loads(bytes(response.body)).get("error", {})
    except ValueError:
        error = {}
    return (f"the provider declined (HTTP {response.status}, {error.get('code', 'unknown')}): "
            f"{error.get('message', 'no message')}")


class Reconciler(exports.Reconciler):
    def reconcile(self, tool_name, args_json, attempt):
        if tool_name != "refund":
            return types.Reconciliation_StillUnknown(f"`{tool_name}` has no side effects to reconcile")
        base = outbound.config("api_base")
        if base is None:
            return types.Reconciliation_StillUnknown("the plugin setting `api_base` is not configured")
        field = outbound.config("key_metadata_field") or "toolguard_key"
        payment_intent = json.loads(args_json)["payment_intent"]
        try:
            refunds = list_refunds(base.rstrip("/"), payment_intent)
        except Err as e:
            return types.Reconciliation_StillUnknown(f"listing the refunds of {payment_intent} failed: {e.value}")
        for r in refunds:
            if (r.get("metadata") or {}).get(field) == attempt.key:
                return types.Reconciliation_Found(types.Response(
                    status=200, headers=[types.Header(name="content-type", value="application/json")],
                    body=json.dumps(r).encode()))
        return types.Reconciliation_NotFound()
