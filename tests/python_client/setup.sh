#!/usr/bin/env bash
# Create (once) a virtualenv with the Python client of clients/python installed
# from its path, as a user installs it, for tests/integration/python_client.rs
# and tests/integration/balancer.rs. Reinstalls when the client's files
# change; fails loudly if the install fails. Prints the venv's python last.
#
# usage: tests/python_client/setup.sh [VENV_DIR]
#   VENV_DIR defaults to $CARGO_TARGET_DIR/tmp/client-venv.
#   CLIENT_TEST_PYTHON picks the interpreter (default: the real one behind python3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
client="$here/../../clients/python"
target=${CARGO_TARGET_DIR:-$here/../../target}
venv=${1:-$target/tmp/client-venv}
python=${CLIENT_TEST_PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

# The client's own files (not what a build leaves beside them).
stamp=$(cd "$client" && find pyproject.toml README.md src -name '*.egg-info' -prune -o -type f -name '*.py' -print -o -type f -name '*.toml' -print -o -type f -name '*.md' -print | LC_ALL=C sort | xargs sha256sum | sha256sum)
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/client.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "$venv/bin/python"
    exit 0
fi

echo "setting up $venv with $python" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
# Not editable: the test sees what `pip install clients/python` installs.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$client" >&2
"$venv/bin/python" -c 'import code_executor_client'
echo "$stamp" > "$venv/client.stamp"
echo "$venv/bin/python"
