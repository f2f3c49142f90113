#!/usr/bin/env bash
# Side by side with the peers: the same workload through abridge, a bare Python
# sqlite3 baseline, the OpenAI Agents SDK's SQLiteSession and LangGraph's SQLite
# checkpointer. Installs the peers at pinned versions into a virtual environment,
# runs everything in one go, prints a table and writes it to docs/benchmarks.md.
#
#   benches/peers/run.sh [K] [STEPS] [LANGGRAPH_BUDGET_SECONDS]
set -euo pipefail
cd "$(dirname "$0")/../.."
K=${1:-3}
STEPS=${2:-160}
BUDGET=${3:-300}
SYNC=${SYNC:-normal}
HS=${HS:-"100 1000 10000"}
VENV=benches/peers/.venv

if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
"$VENV/bin/pip" install --quiet --disable-pip-version-check \
  langgraph==1.2.24 langgraph-checkpoint-sqlite==3.1.2 openai-agents==0.24.0

cargo build --release --quiet --example peer_workload
out=$(mktemp)
for H in $HS; do
  ./target/release/examples/peer_workload "$H" "$K" "$STEPS" on "$SYNC" >> "$out"
  ./target/release/examples/peer_workload "$H" "$K" "$STEPS" off "$SYNC" >> "$out"
  ./target/release/examples/peer_workload "$H" "$K" "$STEPS" on "$SYNC" inplace >> "$out"
  "$VENV/bin/python" benches/peers/peers.py sqlite3 "$H" "$K" "$STEPS" "$SYNC" 0 >> "$out"
  "$VENV/bin/python" benches/peers/peers.py sqlitesession "$H" "$K" "$STEPS" "$SYNC" 0 >> "$out"
done
# LangGraph runs turn by turn from zero; give it the budget at the largest H.
TOP=$(echo $HS | awk '{print $NF}')
"$VENV/bin/python" benches/peers/peers.py langgraph 100 "$K" "$STEPS" "$SYNC" "$BUDGET" >> "$out"
"$VENV/bin/python" benches/peers/peers.py langgraph "$TOP" "$K" "$STEPS" "$SYNC" "$BUDGET" >> "$out"

versions=$("$VENV/bin/python" -c "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in ['langgraph','langgraph-checkpoint-sqlite','openai-agents']))")
python3 benches/peers/report.py "$out" "K=$K STEPS=$STEPS SYNC=$SYNC HS='$HS' BUDGET=$BUDGET" "$versions"
rm -f "$out"
