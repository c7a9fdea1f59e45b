#!/usr/bin/env bash
# Headless Chromium and its WebDriver for the dashboard test (Debian packages; idempotent).
# Usage: bash ci/install_browser.sh   (as root, or with sudo available)
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

if have chromium && have chromedriver; then
    echo "chromium and chromedriver already installed: $(chromium --version 2>/dev/null || true)"
    exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if have sudo; then SUDO="sudo"; else echo "install_browser.sh: need root or sudo" >&2; exit 1; fi
fi

export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver fonts-dejavu-core >/dev/null
echo "installed: $(chromium --version 2>/dev/null || echo chromium) / $(chromedriver --version 2>/dev/null | head -1)"
