#!/usr/bin/env bash
# Debian's Chromium for the browser tests (tests/browser): Playwright drives /usr/bin/chromium.
# Never `playwright install`: it downloads a browser build, and the machines reach package
# registries only.
set -euo pipefail
if [ -x /usr/bin/chromium ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium
