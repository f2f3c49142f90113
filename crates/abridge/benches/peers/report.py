"""Turns the JSON lines of run.sh into a table, prints it, and writes it into
docs/benchmarks.md between the peers markers."""

import json
import platform
import os
import subprocess
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
params, versions = sys.argv[2], sys.argv[3]


def cpu():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def sqlite_version():
    import sqlite3
    return sqlite3.sqlite_version


head = "| library | H | step p50 ms | step p99 ms | context build p50 ms | DB bytes at H | bytes/turn | peak RSS MB | × bare insert (own driver) |"
lines = [head, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
for r in rows:
    h = f"{r['h']}" + ("" if r.get("h_asked", r["h"]) == r["h"] else f" (of {r['h_asked']} asked)")
    lines.append(
        f"| {r['lib']} | {h} | {r['step_p50_ms']:.3f} | {r['step_p99_ms']:.3f} | {r['build_p50_ms']:.3f} | "
        f"{r['db_bytes']:,} | {r['bytes_per_turn']:,.0f} | {r['peak_rss_mb']:.0f} | {r['relative_to_bare']:.0f} |"
    )


def find(lib, h):
    for r in rows:
        if r["lib"] == lib and r["h"] == h:
            return r
    return None


ratios = []
for h in sorted({r["h"] for r in rows if r["lib"].startswith("abridge")}):
    on = find("abridge (compaction on)", h)
    inplace = next((r for r in rows if r["lib"] == "abridge (compaction on, Blocking::InPlace)" and r["h"] == h), None)
    for peer in ["openai-agents SQLiteSession", "python sqlite3 (bare)", "langgraph SqliteSaver"]:
        p = find(peer, h)
        if on and p:
            ratios.append(f"- H={h}: abridge (compaction on) is {p['step_p50_ms'] / on['step_p50_ms']:.1f}× cheaper per step than {peer}")
        if inplace and p:
            ratios.append(f"- H={h}: abridge (compaction on, Blocking::InPlace) is {p['step_p50_ms'] / inplace['step_p50_ms']:.1f}× cheaper per step than {peer}")
    off, base = find("abridge (compaction off)", h), find("python sqlite3 (bare)", h)
    if off and base:
        ratios.append(f"- H={h}: abridge (compaction off) costs {off['step_p50_ms'] / base['step_p50_ms']:.2f}× the bare Python sqlite3 baseline per step")
ons = sorted((r for r in rows if r["lib"] == "abridge (compaction on)"), key=lambda r: r["h"])
for g in (r for r in rows if r["lib"] == "langgraph SqliteSaver"):
    if ons and not find("abridge (compaction on)", g["h"]):
        near = min(ons, key=lambda r: abs(r["h"] - g["h"]))
        ratios.append(f"- H={g['h']} (the largest LangGraph reached): abridge (compaction on, measured at H={near['h']}; flat in H) "
                      f"is {g['step_p50_ms'] / near['step_p50_ms']:.1f}× cheaper per step than langgraph SqliteSaver")
if len(ons) >= 2:
    ratios.append(f"- flat with compaction on: step p50 at H={ons[-1]['h']} is {ons[-1]['step_p50_ms'] / ons[0]['step_p50_ms']:.2f}× that at H={ons[0]['h']}; "
                  f"context build {ons[-1]['build_p50_ms'] / ons[0]['build_p50_ms']:.2f}×; bytes per turn {ons[-1]['bytes_per_turn'] / ons[0]['bytes_per_turn']:.2f}×")

rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
block = "\n".join([
    "<!-- peers:begin -->",
    f"Machine: {cpu()}, {os.cpu_count()} cores, Linux {platform.release()}; Python {platform.python_version()} with SQLite {sqlite_version()}; abridge at {rev} with its bundled SQLite.",
    f"Versions: {versions}. Parameters: {params}.",
    "Command: `benches/peers/run.sh` (all figures from one run).",
    "",
    *lines,
    "",
    *ratios,
    "<!-- peers:end -->",
])
print(block)
path = "docs/benchmarks.md"
doc = open(path).read() if os.path.exists(path) else ""
if "<!-- peers:begin -->" in doc:
    a = doc.index("<!-- peers:begin -->")
    b = doc.index("<!-- peers:end -->") + len("<!-- peers:end -->")
    doc = doc[:a] + block + doc[b:]
else:
    doc += "\n" + block + "\n"
open(path, "w").write(doc)
