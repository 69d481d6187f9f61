#!/usr/bin/env bash
# Create (once) the virtualenv holding the pinned official Python MCP SDK that
# the MCP interoperability tests (tests/integration/mcp_python.rs) drive.
# Idempotent: reuses the venv while requirements.txt is unchanged. Fails
# loudly if the install fails. Prints the venv's python as its last line.
#
# usage: tests/mcp_client/setup.sh [VENV_DIR [REQUIREMENTS]]
#   VENV_DIR defaults to $CARGO_TARGET_DIR/tmp/mcp-venv (target/tmp/mcp-venv),
#   where the tests look for it; REQUIREMENTS to requirements.txt here
#   (requirements-v1.txt pins the last 1.x SDK).
#   MCP_TEST_PYTHON picks the interpreter (default: the real one behind python3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
target=${CARGO_TARGET_DIR:-$here/../../target}
venv=${1:-$target/tmp/mcp-venv}
requirements=${2:-$here/requirements.txt}
# What the pinned SDK must import (httpx2 is the 2.x SDK's HTTP client).
check=${MCP_IMPORT_CHECK:-import mcp, httpx2}
python=${MCP_TEST_PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$venv/requirements.txt" \
    && "$venv/bin/python" -c "$check" 2>/dev/null; then
    echo "$venv/bin/python"
    exit 0
fi

echo "setting up $venv with $python" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    -r "$requirements" >&2
"$venv/bin/python" -c "$check"
cp "$requirements" "$venv/requirements.txt"
echo "$venv/bin/python"
