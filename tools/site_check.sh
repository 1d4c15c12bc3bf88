#!/usr/bin/env bash
# The website as a reader gets it: builds _site/ (tools/site.sh), serves it with `python -m http.server` on
# 127.0.0.1, opens every page in headless Chromium over http:// and from file://, and fails on a page that does not
# load, a missing image (or script, style sheet), a request that leaves the site, a console error, math left
# untypeset or raw `$...$` / `\(...\)` in prose, or a broken link inside the site (tools/site/check.cjs).
# Saves screenshots of the home page, chapter 05 (math and a figure) and chapter 20 (the study) and prints their folder.
#   bash tools/site_check.sh [--no-build]
# Installs what it needs when missing: Debian's chromium (apt-get), playwright-core from npm into
# _site_check/node/ (it drives /usr/bin/chromium; no browser is downloaded).
# Environment: CHROMIUM (the browser, default /usr/bin/chromium), SITE (default _site), SHOTS (screenshot folder, default _site_check/screenshots), PLAYWRIGHT_VERSION,
# SITE_CHECK_PAGE_TIMEOUT (seconds per page, default 180), SITE_CHECK_FILE=0 to skip the file:// pass.
set -euo pipefail
cd "$(dirname "$0")/.."

SITE=${SITE:-_site}
SHOTS=${SHOTS:-_site_check/screenshots}
NODE_DIR=_site_check/node
PLAYWRIGHT_VERSION=${PLAYWRIGHT_VERSION:-1.65.1}

if [ "${1:-}" != "--no-build" ]; then
  bash tools/site.sh
fi
[ -f "$SITE/index.html" ] || { echo "site check: no $SITE/index.html; run bash tools/site.sh"; exit 1; }

export CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  echo "== site check: installing Debian's chromium"
  sudo=; [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium >/dev/null
fi
if [ ! -f "$NODE_DIR/node_modules/playwright-core/package.json" ] || \
   [ "$(node -p "require('./$NODE_DIR/node_modules/playwright-core/package.json').version")" != "$PLAYWRIGHT_VERSION" ]; then
  echo "== site check: installing playwright-core@$PLAYWRIGHT_VERSION from npm into $NODE_DIR"
  mkdir -p "$NODE_DIR"
  [ -f "$NODE_DIR/package.json" ] || echo '{"private": true}' > "$NODE_DIR/package.json"
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --silent "playwright-core@$PLAYWRIGHT_VERSION"
fi

# A free port on the loopback, and the server; stopped on exit, whatever happens.
PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
mkdir -p _site_check
port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$PY" -m http.server --bind 127.0.0.1 --directory "$SITE" "$port" >_site_check/http.log 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true' EXIT
for _ in $(seq 100); do
  "$PY" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/index.html', timeout=2)" 2>/dev/null && break
  sleep 0.3
done

rm -rf "$SHOTS"
file_mode=file; [ "${SITE_CHECK_FILE:-1}" = 0 ] && file_mode=nofile
PLAYWRIGHT_CORE="$PWD/$NODE_DIR/node_modules/playwright-core" \
  node tools/site/check.cjs "$SITE" "$SHOTS" "http://127.0.0.1:$port/" "$file_mode"
