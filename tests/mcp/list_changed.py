"""The official Python SDK's client, told by toolguard that its tool list changed.

Usage: list_changed.py URL MODE

Connects — MODE `legacy`: the 2025-11-25 handshake, a session whose server
may notify it; MODE `auto`: 2026-07-28, listening on `subscriptions/listen`
for tool changes — lists the tools and prints {"step": "listed", "tools":
[...]}; then waits (at most 120 s) for the tool list to change, lists again
and prints {"step": "changed", "tools": [...]}. The Rust test reloads the
host in between.
"""

import asyncio
import json
import sys

from mcp import Client


async def main():
    url, mode = sys.argv[1], sys.argv[2]
    if mode == "auto":
        async with Client(url, mode="auto") as c:
            async with c.listen(tools_list_changed=True) as sub:
                tools = await c.list_tools()
                print(json.dumps({"step": "listed", "protocol": str(c.session.protocol_version), "tools": sorted(t.name for t in tools.tools)}), flush=True)
                async def first_event():
                    async for _ in sub:
                        return
                await asyncio.wait_for(first_event(), 120)
                tools = await c.list_tools()
                print(json.dumps({"step": "changed", "tools": sorted(t.name for t in tools.tools)}), flush=True)
        return
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
