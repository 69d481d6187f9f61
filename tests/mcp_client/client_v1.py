"""Drive code-executor's MCP server with the last 1.x release of the official
Python MCP SDK (requirements-v1.txt) and report what it saw as one JSON object
on stdout; the assertions are in tests/integration/mcp_python.rs.

usage:
  client_v1.py stdio <server-binary> <python>
  client_v1.py http <url> <bearer-token>
"""

import asyncio
import json
import sys

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


async def exercise(session):
    init = await session.initialize()
    report = {"protocol_version": init.protocolVersion, "server_name": init.serverInfo.name}
    report["tools"] = sorted(t.name for t in (await session.list_tools()).tools)
    result = await session.call_tool("execute_code", {"code": "print(2+2)"})
    report["text"] = "\n".join(c.text for c in result.content if c.type == "text")
    report["structured_stdout"] = (result.structuredContent or {}).get("stdout")
    messages = []

    async def on_progress(value, total, message):
        messages.append(message)

    await session.call_tool(
        "execute_code", {"code": "for i in range(5):\n    print('line', i)"}, progress_callback=on_progress
    )
    report["progress"] = messages
    code = (
        "import base64\n"
        f"open('pixel.png', 'wb').write(base64.b64decode('{PIXEL}'))\n"
    )
    result = await session.call_tool("execute_code", {"code": code})
    links = [str(c.uri) for c in result.content if c.type == "resource_link"]
    report["links"] = links
    if links:
        read = await session.read_resource(links[0])
        blob = read.contents[0]
        report["read"] = {"mime": blob.mimeType, "blob": getattr(blob, "blob", None)}
    report["resources"] = [str(r.uri) for r in (await session.list_resources()).resources]
    return report


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        params = StdioServerParameters(
            command=sys.argv[2], args=["mcp", "--python", sys.argv[3], "--pool-size", "2"], env={}
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                report = await exercise(session)
    elif mode == "http":
        headers = {"Authorization": f"Bearer {sys.argv[3]}"}
        async with streamablehttp_client(sys.argv[2], headers=headers) as (read, write, _):
            async with ClientSession(read, write) as session:
                report = await exercise(session)
    else:
        sys.exit(f"unknown mode {mode!r}")
    print(json.dumps(report))


asyncio.run(main())
