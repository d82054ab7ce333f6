"""A real MCP client (the official Python SDK) whose user a tool asks.

Usage: questions.py URL MODE TOOL CALL_ID ANSWER

Calls TOOL (of the asking-refund fixture) for a 2500-cent refund of
`pi_ask` as tool call CALL_ID. MODE is the SDK's protocol mode: "auto"
(2026-07-28: the host answers `input_required` and the SDK retries with
the answers) or "legacy" (2025-11-25: the host sends `elicitation/create`
while the call waits). ANSWER is what the elicitation callback says:
"confirm", "refuse" or "decline". Prints one JSON object: the protocol,
what the user was asked, and the tool result.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.types import ElicitResult

ARGS = {"payment_intent": "pi_ask", "amount_cents": 2500}


async def main():
    url, mode, tool, call_id, answer = sys.argv[1:6]
    asked = []

    async def elicit(context, params):
        asked.append(params.message)
        if answer == "decline":
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content={"confirm": answer == "confirm", "note": f"python {mode}"})

    async with Client(url, mode=mode, elicitation_callback=elicit) as c:
        meta = {"toolguard/toolCallId": call_id, "toolguard/sessionId": f"py-{mode}"}
        result = await c.call_tool(tool, ARGS, meta=meta)
        print(json.dumps({
            "protocol": str(c.session.protocol_version),
            "asked": asked,
            "is_error": bool(result.is_error),
            "structured": result.structured_content,
            "text": [b.text for b in result.content if getattr(b, "text", None)],
        }), flush=True)


asyncio.run(main())
