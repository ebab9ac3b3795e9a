#!/usr/bin/env bash
# Installs what the end-to-end tests need: Debian's kcat and Chromium (headless), a Python venv
# with the Kafka clients and the S3 server (moto), and the Azure Blob emulator (azurite, npm) under
# tests/cloud/node_modules.
# Idempotent; used by `make test` and `.ci/run`.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive

apt_missing=()
command -v kcat >/dev/null 2>&1 || apt_missing+=(kcat)
command -v npm >/dev/null 2>&1 || apt_missing+=(nodejs npm)
# Headless Chromium loads the status page in tests/e2e/test_status_page.py.
command -v chromium >/dev/null 2>&1 || apt_missing+=(chromium)
if [ ${#apt_missing[@]} -gt 0 ]; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
    $SUDO apt-get update -q
    $SUDO apt-get install -y -q --no-install-recommends "${apt_missing[@]}"
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

# Azurite, pinned by tests/cloud/package-lock.json; reinstalled when the lock file changes.
npm_stamp=tests/cloud/node_modules/.lock.sha
npm_wanted=$(sha256sum tests/cloud/package-lock.json | cut -d' ' -f1)
if [ "$(cat "$npm_stamp" 2>/dev/null)" != "$npm_wanted" ] || [ ! -x tests/cloud/node_modules/.bin/azurite-blob ]; then
    (cd tests/cloud && npm ci --no-audit --no-fund --loglevel=error)
    echo "$npm_wanted" > "$npm_stamp"
fi
