#!/usr/bin/env bash
# Regenerates docs/report.png (and docs/report-dark.png): the demo's first
# session as `abridge report` draws it, rendered by headless Chromium in the
# light and the dark colour scheme. Needs Chromium (Debian: apt-get install chromium).
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cargo run -q -- demo --db "$tmp/demo.db" > /dev/null
cargo run -q -- report --db "$tmp/demo.db" --session demo-42-0 \
  --compact-at 4000 --soft-share 0.8 -o "$tmp/session.html"
shot() {
  chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size=1280,1500 "$@" "file://$tmp/session.html" 2>/dev/null
}
shot --screenshot="$PWD/docs/report.png"
shot --force-dark-mode --blink-settings=preferredColorScheme=0 --screenshot="$PWD/docs/report-dark.png"
echo "wrote docs/report.png and docs/report-dark.png"
