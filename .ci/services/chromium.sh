#!/usr/bin/env bash
# Headless Chromium for the HTML report's browser test (tests/test_browser.py): Debian's package, nothing downloaded
# by a test tool.
#
#   .ci/services/chromium.sh start   # prints `export DISTPERF_TEST_CHROMIUM=...` (stdout only); the rest to stderr
#   .ci/services/chromium.sh stop    # nothing to stop: each test starts and ends its own browser process
#
# Idempotent: start with Chromium already installed only prints the export.
set -euo pipefail

log() { echo "chromium.sh: $*" >&2; }

find_browser() {
  local name
  for name in chromium chromium-browser; do
    if command -v "$name" >/dev/null 2>&1; then
      command -v "$name"
      return 0
    fi
  done
  return 1
}

case "${1:-}" in
  start)
    if ! find_browser >/dev/null; then
      [ "$(id -u)" = 0 ] || { log "not root: cannot install chromium (apt-get install chromium)"; exit 1; }
      log "installing chromium (Debian package)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq >&2
      apt-get install -y -qq chromium >&2
    fi
    browser="$(find_browser)" || { log "chromium is not on PATH after installing it"; exit 1; }
    log "$("$browser" --version 2>/dev/null | head -n 1)"
    echo "export DISTPERF_TEST_CHROMIUM=$browser"
    ;;
  stop)
    ;;
  *)
    echo "usage: $0 start|stop" >&2
    exit 2
    ;;
esac
