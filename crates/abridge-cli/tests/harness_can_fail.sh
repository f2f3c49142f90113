#!/usr/bin/env bash
# The chaos harness is shown able to fail: each deliberately broken build must be
# caught (violations, exit status 1) within a bounded run.
#   broken-idempotency: a completed tool invocation runs again on resume.
#   broken-draft-read:  a step reads a compaction another live runner is writing.
# Each is a feature of abridge-cli (forwarded to abridge-testkit) that turns on
# the engine's TestKnobs::sabotage knob in every runner the harness builds.
set -euo pipefail
cd "$(dirname "$0")/../../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for feature in broken-idempotency broken-draft-read; do
  cargo build --quiet -p abridge-cli --features "$feature" --bin abridge
  cp target/debug/abridge "$work/abridge-$feature"
done
# Put the normal binary back for whatever runs next.
cargo build --quiet -p abridge-cli --bin abridge

status=0
for feature in broken-idempotency broken-draft-read; do
  caught=no
  for seed in 1 2 3; do
    set +e
    "$work/abridge-$feature" chaos --db "$work/$feature.db" --workers 4 --kills 120 \
      --sessions 8 --turns 8 --seed "$seed" --max-seconds 300 --json > "$work/$feature.json"
    code=$?
    set -e
    violations=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['violations']))" "$work/$feature.json")
    if [ "$code" -eq 1 ] && [ "$violations" -gt 0 ]; then
      caught=yes
      echo "harness caught $feature (seed $seed): $violations violations, e.g."
      python3 -c "import json,sys; print('  ', json.load(open(sys.argv[1]))['violations'][0])" "$work/$feature.json"
      break
    fi
  done
  if [ "$caught" != yes ]; then
    echo "harness did NOT catch $feature" >&2
    status=1
  fi
done
exit $status
