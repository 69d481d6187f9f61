"""Drive code-executor's MCP server with the official Python MCP SDK and report
what a client sees, as one JSON object on stdout. The Rust tests
(tests/integration/mcp_python.rs) make the assertions.

usage:
  client.py stdio <server-binary> <python> [NAME=VALUE ...]   # env for the server
  client.py http <url> [<bearer-token>]
  client.py balanced <url>     # one MCP session through a load balancer
  client.py progress <server-binary> <python>   # progress notifications over stdio

Needs the pinned SDK from requirements.txt (installed by setup.sh).
"""

import asyncio
import json
import os
import sys
import time
import uuid

import httpx2
from mcp import ClientSession, MCPError, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client


def call_report(result):
    return {
        "is_error": result.is_error,
        "text": "\n".join(c.text for c in result.content if c.type == "text"),
        "structured": result.structured_content,
        "content": [
            {"type": c.type, "mime": getattr(c, "mime_type", None), "data": getattr(c, "data", None)}
            for c in result.content
            if c.type != "text"
        ],
    }


# A 1x1 PNG, written by the run to come back as image content.
PIXEL = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def processes_with(marker):
    """Pids of live (non-zombie) processes whose command line holds `marker`."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


async def cancellation(session):
    """Start a run that spawns a marked grandchild and sleeps; let the client
    time out (it then sends notifications/cancelled); report whether the
    marked process was seen and how soon it was gone."""
    marker = f"mcp-cancel-{uuid.uuid4().hex}"
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', '{marker}'])\n"
        "time.sleep(120)\n"
    )
    report = {"marker": marker}
    started = time.monotonic()
    task = asyncio.ensure_future(
        session.call_tool("execute_code", {"code": code, "timeout": 60}, read_timeout_seconds=3)
    )
    # The marked process must appear while the run is in flight.
    seen = False
    while not task.done() and time.monotonic() - started < 3:
        if processes_with(marker):
            seen = True
            break
        await asyncio.sleep(0.02)
    report["seen_running"] = seen
    try:
        result = await task
        report["client_error"] = None
        report["result"] = call_report(result)
    except MCPError as e:
        report["client_error"] = str(e)
    cancelled_at = time.monotonic()
    gone_after = None
    while time.monotonic() - cancelled_at < 10:
        if not processes_with(marker):
            gone_after = time.monotonic() - cancelled_at
            break
        await asyncio.sleep(0.05)
    report["gone_after_s"] = gone_after
    # The server stays healthy: the next call works.
    report["after"] = call_report(await session.call_tool("execute_code", {"code": "print('alive')"}))
    return report


async def exercise(session, concurrent):
    report = {}
    init = await session.initialize()
    report["protocol_version"] = init.protocol_version
    report["server_name"] = init.server_info.name
    report["instructions"] = init.instructions

    tools = (await session.list_tools()).tools
    report["tools"] = {
        t.name: {
            "description": t.description,
            "input_schema": t.input_schema,
            "output_schema": t.output_schema,
        }
        for t in tools
    }

    calls = {
        "success": {"code": "print(2+2)"},
        "syntax_error": {"code": "def f(:\n    pass\n"},
        "zero_division": {"code": "print('before')\n1/0\n"},
        "timeout": {"code": "while True: pass", "timeout": 1},
        "unknown_env": {"code": "print(1)", "env": "no-such-env"},
        "files_and_stdin": {
            "code": "import sys\nprint(open('data/in.txt').read(), sys.stdin.read())",
            "files": {"data/in.txt": "from file"},
            "stdin": "from stdin",
        },
        "bad_args": {"cod": "print(1)"},
    }
    report["calls"] = {}
    for name, args in calls.items():
        started = time.monotonic()
        try:
            result = call_report(await session.call_tool("execute_code", args))
        except MCPError as e:
            result = {"protocol_error": str(e)}
        result["elapsed_s"] = time.monotonic() - started
        report["calls"][name] = result

    report["list_environments"] = call_report(await session.call_tool("list_environments", {}))

    image_code = f"import base64\nopen('pixel.png', 'wb').write(base64.b64decode('{PIXEL}'))"
    report["image"] = call_report(await session.call_tool("execute_code", {"code": image_code}))

    progress = []

    async def on_progress(value, total, message):
        progress.append({"value": value, "message": message, "at": time.monotonic()})

    started = time.monotonic()
    code = "import time\nprint('tick', flush=True)\ntime.sleep(0.6)\nprint('tock')"
    result = await session.call_tool("execute_code", {"code": code}, progress_callback=on_progress)
    report["progress"] = {
        "result": call_report(result),
        "events": [
            {"value": p["value"], "message": p["message"], "after_s": p["at"] - started}
            for p in progress
        ],
        "elapsed_s": time.monotonic() - started,
    }

    if concurrent:
        codes = [f"import time\ntime.sleep(0.2)\nprint({i} * {i})" for i in range(concurrent)]
        results = await asyncio.gather(
            *(session.call_tool("execute_code", {"code": c}) for c in codes)
        )
        report["concurrent"] = [call_report(r) for r in results]

    report["cancel"] = await cancellation(session)
    return report


async def balanced(session, http):
    """initialize, tools/list, 20 execute_code calls and the session tools, as
    one MCP session; which cookies the SDK's HTTP client kept."""
    started = time.monotonic()
    init = await session.initialize()
    report = {"server_name": init.server_info.name}
    report["tools"] = [t.name for t in (await session.list_tools()).tools]
    report["calls"] = [
        call_report(await session.call_tool("execute_code", {"code": f"print({i} * {i})"}))
        for i in range(20)
    ]
    created = await session.call_tool("create_session", {})
    sid = (created.structured_content or {}).get("id")
    report["session"] = {
        "created": call_report(created),
        "set": call_report(await session.call_tool("execute_code", {"code": "v = 42", "session": sid})),
        "read": call_report(await session.call_tool("execute_code", {"code": "print(v)", "session": sid})),
        "closed": call_report(await session.call_tool("close_session", {"session": sid})),
    }
    report["cookies"] = sorted({c.name for c in http.cookies.jar})
    report["exercised_s"] = time.monotonic() - started
    return report


async def progress_runs(session):
    """Output as progress notifications: five quick lines, twenty times, and
    a flood of 100,000 prints; what arrived, in order."""
    report = {"quick": [], "flood": {}}
    for _ in range(20):
        messages = []

        async def on_progress(value, total, message, messages=messages):
            messages.append(message)

        code = "for i in range(5):\n    print('line', i)"
        await session.call_tool("execute_code", {"code": code}, progress_callback=on_progress)
        report["quick"].append(messages)
    messages = []

    async def on_flood(value, total, message):
        messages.append(message)

    started = time.monotonic()
    result = await session.call_tool(
        "execute_code", {"code": "for i in range(100000):\n    print(i)"}, progress_callback=on_flood
    )
    report["flood"] = {
        "messages": messages,
        "seconds": time.monotonic() - started,
        "structured_stdout_len": len((result.structured_content or {}).get("stdout", "")),
    }
    return report


async def main():
    mode = sys.argv[1]
    if mode == "stdio":
        binary, python = sys.argv[2], sys.argv[3]
        env = dict(a.split("=", 1) for a in sys.argv[4:])
        params = StdioServerParameters(
            command=binary, args=["mcp", "--python", python, "--pool-size", "2"], env=env
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                report = await exercise(session, concurrent=0)
    elif mode == "http":
        url = sys.argv[2]
        headers = {"Authorization": f"Bearer {sys.argv[3]}"} if len(sys.argv) > 3 else {}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
            async with streamable_http_client(url, http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    report = await exercise(session, concurrent=10)
    elif mode == "progress":
        binary, python = sys.argv[2], sys.argv[3]
        params = StdioServerParameters(
            command=binary, args=["mcp", "--python", python, "--pool-size", "2"], env={}
        )
        async with stdio_client(params) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                report = await progress_runs(session)
    elif mode == "balanced":
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30, read=120)) as http:
            async with streamable_http_client(sys.argv[2], http_client=http) as (read, write):
                async with ClientSession(read, write) as session:
                    report = await balanced(session, http)
                closing = time.monotonic()
            report["closed_s"] = time.monotonic() - closing
    else:
        sys.exit(f"unknown mode {mode!r}")
    print(json.dumps(report))


asyncio.run(main())
