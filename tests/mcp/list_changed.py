"""The official Python SDK's client, told by toolguard that its tool list changed.

Usage: list_changed.py URL

Connects (the 2025-11-25 handshake: a session whose server may notify it),
lists the tools and prints {"step": "listed", "tools": [...]}; then waits
(at most 120 s) for notifications/tools/list_changed, lists again and
prints {"step": "changed", "tools": [...]}. The Rust test reloads the host
in between.
"""

import asyncio
import json
import sys

from mcp import Client


async def main():
    url = sys.argv[1]
    changed = asyncio.Event()

    async def on_message(message):
        message = getattr(message, "root", message)
        if getattr(message, "method", "") == "notifications/tools/list_changed":
            changed.set()

    async with Client(url, mode="legacy", message_handler=on_message) as c:
        tools = await c.list_tools()
        print(json.dumps({"step": "listed", "tools": sorted(t.name for t in tools.tools)}), flush=True)
        await asyncio.wait_for(changed.wait(), 120)
        tools = await c.list_tools()
        print(json.dumps({"step": "changed", "tools": sorted(t.name for t in tools.tools)}), flush=True)


asyncio.run(main())
