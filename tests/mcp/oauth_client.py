"""The official Python SDK's OAuth client against `toolguard serve --http`
behind [mcp.oauth]: it learns the authorization server from the server's
protected-resource metadata (its 401's `resource_metadata`), gets a
client-credentials token for this resource (RFC 8707), and calls tools; a
403 `insufficient_scope` makes it ask for the scope named (step-up).

Usage: oauth_client.py URL ISSUER CLIENT_ID SECRET SCOPE CALLS_JSON
CALLS_JSON: [[tool, args, call_id], ...]. Prints one JSON object per call.
"""

import asyncio
import json
import sys

from mcp import Client
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client


class Memory:
    """Token storage for one run."""

    def __init__(self):
        self.tokens = None
        self.info = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.info

    async def set_client_info(self, info):
        self.info = info


async def main():
    url, issuer, client_id, secret, scope, calls = sys.argv[1:7]
    provider = ClientCredentialsOAuthProvider(
        server_url=url, storage=Memory(), client_id=client_id, client_secret=secret, scope=scope or None, issuer=issuer
    )
    http = create_mcp_http_client(auth=provider)
    async with Client(streamable_http_client(url, http_client=http), mode="auto") as c:
        for tool, args, call_id in json.loads(calls):
            try:
                r = await c.call_tool(tool, args, meta={"toolguard/toolCallId": call_id, "toolguard/sessionId": "s1"})
                print(json.dumps({"tool": tool, "is_error": bool(r.is_error), "structured": r.structured_content, "meta": r.meta or {}}), flush=True)
            except Exception as e:  # the test reads what failed
                print(json.dumps({"tool": tool, "exception": repr(e)}), flush=True)


asyncio.run(main())
