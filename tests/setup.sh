#!/usr/bin/env bash
# Installs what the end-to-end tests need: Debian's kcat and a Python venv with the Kafka clients.
# Idempotent; used by `make test` and `.ci/run`.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

if ! command -v kcat >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends kcat
fi

if [ ! -x .venv/bin/python ]; then
    python3 -m venv .venv
fi
stamp=.venv/.requirements.sha
wanted=$(sha256sum tests/requirements.txt | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    .venv/bin/python -m pip install -q --disable-pip-version-check -r tests/requirements.txt
    echo "$wanted" > "$stamp"
fi
