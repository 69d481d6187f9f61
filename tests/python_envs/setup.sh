#!/usr/bin/env bash
# Create (once) a virtualenv with the pinned packages of tests/python_envs/NAME.txt,
# for tests and benchmarks that need third-party packages (matplotlib, numpy).
# Idempotent: reuses the venv while NAME.txt is unchanged; fails loudly if the
# install fails. Prints the venv's python as its last line.
#
# usage: tests/python_envs/setup.sh NAME [VENV_DIR]
#   VENV_DIR defaults to $CARGO_TARGET_DIR/tmp/NAME-venv (target/tmp/NAME-venv).
#   TEST_PYTHON picks the interpreter (default: the real one behind python3).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
name=${1:?usage: setup.sh NAME [VENV_DIR]}
requirements="$here/$name.txt"
[ -f "$requirements" ] || { echo "no such package list: $requirements" >&2; exit 2; }
target=${CARGO_TARGET_DIR:-$here/../../target}
venv=${2:-$target/tmp/$name-venv}
python=${TEST_PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9

if [ -x "$venv/bin/python" ] && cmp -s "$requirements" "$venv/requirements.txt"; then
    echo "$venv/bin/python"
    exit 0
fi

echo "setting up $venv with $python" >&2
rm -rf "$venv"
"$python" -m venv "$venv"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --only-binary :all: \
    -r "$requirements" >&2
cp "$requirements" "$venv/requirements.txt"
echo "$venv/bin/python"
