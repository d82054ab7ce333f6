"""A real MCP client (the official Python SDK) asked to approve a refund.

Usage: consent.py URL MODE DECISION

Calls `refund` of 5000 cents (above the test's approval line) with a
tool-call id. MODE is the SDK's protocol mode: "auto" (2026-07-28: the host
answers `input_required` and the SDK retries with the answer) or "legacy"
(2025-11-25: the host sends `elicitation/create` while the call waits).
DECISION is "approve" or "deny": what the elicitation callback answers.
Prints one JSON object: the protocol, what the user was asked, and the
tool result.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.types import ElicitResult

ARGS = {"payment_intent": "pi_mcp", "amount_cents": 5000, "reason": "duplicate"}


async def main():
    url, mode, decision = sys.argv[1], sys.argv[2], sys.argv[3]
    asked = []

    async def elicit(context, params):
        asked.append(params.message)
        return ElicitResult(action="accept", content={"approve": decision == "approve", "note": f"python {mode}"})

    async with Client(url, mode=mode, elicitation_callback=elicit) as c:
        meta = {"toolguard/toolCallId": f"py-{mode}-{decision}", "toolguard/sessionId": f"py-{mode}"}
        result = await c.call_tool("refund", ARGS, meta=meta)
        print(json.dumps({
            "protocol": str(c.session.protocol_version),
            "asked": asked,
            "is_error": bool(result.is_error),
            "structured": result.structured_content,
        }), flush=True)


asyncio.run(main())
