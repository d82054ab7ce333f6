"""A real MCP client (the official Python SDK) driving `toolguard serve`.

Usage: client.py (stdio CONFIG TOOLGUARD_BIN | http URL) MODE SANDBOX_URL

Runs the refund scenario and prints one JSON object per step on stdout; the
Rust test that starts it counts refunds at the sandbox and checks each step.
MODE is the SDK's protocol mode: "auto" (2026-07-28) or "legacy" (2025-11-25).
"""

import asyncio
import json
import sys
import urllib.request

from mcp import Client, StdioServerParameters

SESSION = "conversation-42"
ARGS = {"payment_intent": "pi_mcp", "amount_cents": 700, "reason": "requested_by_customer"}


def ids(call_id):
    return {"toolguard/toolCallId": call_id, "toolguard/sessionId": SESSION}


def inject(sandbox, fault):
    req = urllib.request.Request(f"{sandbox}/_sandbox/faults", data=json.dumps(fault).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req).read()


def step(name, result):
    text = next((c.text for c in result.content if getattr(c, "type", "") == "text"), "")
    print(json.dumps({
        "step": name,
        "is_error": bool(result.is_error),
        "structured": result.structured_content,
        "text": text,
        "meta": result.meta or {},
    }), flush=True)


async def main():
    transport, mode, sandbox = sys.argv[1], sys.argv[-2], sys.argv[-1]
    if transport == "stdio":
        target = StdioServerParameters(command=sys.argv[3], args=["serve", "--config", sys.argv[2]])
    else:
        target = sys.argv[2]
    async with Client(target, mode=mode) as c:
        tools = await c.list_tools()
        print(json.dumps({
            "step": "list",
            "protocol": str(c.session.protocol_version),
            "tools": {t.name: (t.annotations.model_dump(by_alias=True, exclude_none=True) if t.annotations else {}) for t in tools.tools},
        }), flush=True)
        step("first", await c.call_tool("refund", ARGS, meta=ids("call-A")))
        step("no-id", await c.call_tool("refund", ARGS))
        # The provider commits but answers after our deadline.
        inject(sandbox, {"kind": "delay-after-commit", "ms": 4000})
        step("timeout", await c.call_tool("refund", ARGS, meta=ids("call-B")))
        # The model re-issues it blindly under a new id: the host resolves call-B
        # first (same key, the provider replays) and answers with its outcome.
        step("blind-repeat", await c.call_tool("refund", ARGS, meta=ids("call-C")))
        # The transport retries the same tool call: its send replays from the ledger.
        step("retry", await c.call_tool("refund", ARGS, meta=ids("call-B")))
        step("replay", await c.call_tool("refund", ARGS, meta=ids("call-B")))
        # The blind repeat, replayed: the same answer, never a run.
        step("blind-repeat-again", await c.call_tool("refund", ARGS, meta=ids("call-C")))
        # Told the outcome, a deliberate repeat under a new id is a new refund.
        step("repeat-after-resolution", await c.call_tool("refund", ARGS, meta=ids("call-D")))
        step("status", await c.call_tool("refund_status", {"payment_intent": "pi_mcp"}))


asyncio.run(main())
