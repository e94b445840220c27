#!/usr/bin/env bash
# Regenerates the Results section of docs/loadtest.md from runs of the load test itself:
# figures are never typed in by hand.
#
#   1. builds the load test and the audio ingress (release) and finds nats-server;
#   2. runs the showcase, nats-pause at 50 streams for 5 s and 10 s, every scenario at
#      10 and 50 streams, and the ceiling (about 12 minutes on 2 cores);
#   3. writes the JSON reports and charts into loadtest/results/ (committed, so the
#      docs can link to them) and splices the generated Markdown between the
#      `results:begin` / `results:end` markers of docs/loadtest.md.
#
# Usage: loadtest/results.sh            everything above (the full Results section)
#        loadtest/results.sh issue8     only the runs issue 8's "Done when" asks for (about
#                                       6 minutes plus the quiet waits): nats-pause at 10
#                                       streams bounded 10 times, nats-pause 1,10,50 both,
#                                       steady 1,10,50 bounded. Writes loadtest/results/issue8-*
#                                       and splices the `issue8:begin` / `issue8:end` block of
#                                       docs/loadtest.md; the rest of the section is untouched.
#                                       WAIT_QUIET (seconds, default 30) bounds each quiet wait.
#        loadtest/results.sh issue13    only the failover runs of issue 13, item 5 (about 10
#                                       minutes): worker-failover 3 runs at 10 frames/s and 2
#                                       at 50; node-failover 3 runs each with TTL 10 s and
#                                       15 s, and 2 each with the node kept down 20 s. Writes
#                                       loadtest/results/issue13-*.json and -*.md (the
#                                       tables); the docs quote them, nothing is spliced.
# Run it on a quiet machine: anything else using the CPU changes the figures. Each run
# waits up to 30 s for the machine to be quiet (--wait-quiet 30) and records what
# other processes used anyway (cpu.other_s in the JSON, a note in the tables).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

NATS_SERVER_BIN="$(bash scripts/ensure-nats-server)"
export NATS_SERVER_BIN
cargo build --release --quiet -p weir-loadtest -p weir-audio-ingress
export WEIR_INGRESS_BIN="$root/target/release/audio-ingress"
lt="$root/target/release/loadtest"
out="$root/loadtest/results"
md="$(mktemp -d)"
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"
trap 'rm -rf "$md"' EXIT

# Replaces the block between `<!-- $1:begin -->` and `<!-- $1:end -->` of
# docs/loadtest.md with $md/section.md.
splice_section() {
    python3 - "$root/docs/loadtest.md" "$md/section.md" "$1" <<'EOF'
import sys, re
doc_path, section_path, marker = sys.argv[1:4]
doc = open(doc_path).read()
section = open(section_path).read().rstrip("\n")
pattern = rf"<!-- {marker}:begin -->.*?<!-- {marker}:end -->"
new, n = re.subn(pattern, lambda m: section, doc, flags=re.S)
if n != 1:
    sys.exit(f"docs/loadtest.md: {marker} markers not found exactly once")
open(doc_path, "w").write(new)
EOF
}

if [[ "${1:-}" == "issue8" ]]; then
    wait_quiet="${WAIT_QUIET:-30}"
    mkdir -p "$out/plots"
    rm -f "$out"/issue8-*.json
    runs="$(mktemp -d)"
    trap 'rm -rf "$md" "$runs"' EXIT
    for i in $(seq 1 10); do
        printf '\n==> loadtest nats-pause --streams 10 --design bounded (run %s of 10)\n' "$i" >&2
        "$lt" nats-pause --streams 10 --design bounded -q --wait-quiet "$wait_quiet" --json "$runs/$i.json" >/dev/null
    done
    python3 - "$runs" "$out/issue8-nats-pause-10-bounded-x10.json" <<'EOF2'
import json, sys, pathlib
d = pathlib.Path(sys.argv[1])
rows = [json.loads((d / f"{i}.json").read_text())[0] for i in range(1, 11)]
pathlib.Path(sys.argv[2]).write_text(json.dumps(rows, indent=2) + "\n")
EOF2
    printf '\n==> loadtest nats-pause --streams 1,10,50 --design both\n' >&2
    "$lt" nats-pause --streams 1,10,50 --design both -q --wait-quiet "$wait_quiet" \
        --json "$out/issue8-nats-pause.json" --markdown "$md/pause.md" --plot "$out/plots/issue8" >/dev/null
    printf '\n==> loadtest steady --streams 1,10,50 --design bounded\n' >&2
    "$lt" steady --streams 1,10,50 --design bounded -q --wait-quiet "$wait_quiet" \
        --json "$out/issue8-steady.json" --markdown "$md/steady.md" --plot "$out/plots/issue8" >/dev/null
    python3 - "$out" >"$md/issue8.md" <<'EOF2'
import json, sys, pathlib, statistics
out = pathlib.Path(sys.argv[1])
def load(name):
    return json.loads((out / f"{name}.json").read_text())
def other_cores(r):
    c = r["cpu"]
    return c["other_s"] / max(c["wall_s"], 0.001)
def med(xs):
    return statistics.median(xs)
lines = []
x10 = load("issue8-nats-pause-10-bounded-x10")
ok = sum(1 for r in x10 if r["frames"]["unaccounted"] == 0 and r["frames"]["explained"]["lost_undetected"] == 0)
lines.append("#### `loadtest nats-pause --streams 10 --design bounded`, 10 runs (5 s SIGSTOP at t = 2 s)")
lines.append("")
lines.append(f"`frames.unaccounted` = 0 and `lost_undetected` = 0 in **{ok} of {len(x10)}** runs.")
lines.append("")
lines.append("| run | unaccounted | lost declared / undetected | overloads / gaps | stale dropped by consumer | handed to handler | delivered late | e2e to handler p50 / p99 / max ms | other processes, cores |")
lines.append("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for i, r in enumerate(x10, 1):
    f, e, g = r["frames"], r["frames"]["explained"], r["ingress"]
    l = f["e2e_latency_ms"]
    lines.append(
        f"| {i} | {f['unaccounted']} | {e['lost_declared']} / {e['lost_undetected']} | {g['overloads']} / {g['gaps']}"
        f" | {f['stale_dropped_by_consumer']} | {f['handed_to_handler']} | {f['delivered_late']}"
        f" | {l['p50']:.1f} / {l['p99']:.1f} / {l['max']:.1f} | {other_cores(r):.2f} |"
    )
lines.append(
    f"| median | {med([r['frames']['unaccounted'] for r in x10])}"
    f" | {med([r['frames']['explained']['lost_declared'] for r in x10])} / {med([r['frames']['explained']['lost_undetected'] for r in x10])}"
    f" | {med([r['ingress']['overloads'] for r in x10])} / {med([r['ingress']['gaps'] for r in x10])}"
    f" | {med([r['frames']['stale_dropped_by_consumer'] for r in x10])} | {med([r['frames']['handed_to_handler'] for r in x10])}"
    f" | {med([r['frames']['delivered_late'] for r in x10])}"
    f" | {med([r['frames']['e2e_latency_ms']['p50'] for r in x10]):.1f} / {med([r['frames']['e2e_latency_ms']['p99'] for r in x10]):.1f} / {med([r['frames']['e2e_latency_ms']['max'] for r in x10]):.1f}"
    f" | {med([other_cores(r) for r in x10]):.2f} |"
)
lines.append("")
lines.append("#### The checks, read from the JSON")
lines.append("")
for r in load("issue8-nats-pause"):
    f, g = r["frames"], r["ingress"]
    l = f["e2e_latency_ms"]
    lines.append(
        f"- nats-pause {r['streams']} {r['design']}: e2e to handler p99 {l['p99']:.1f} ms (max {l['max']:.1f}, budget"
        f" {f['late_after_ms']:.0f}), overloads {g['overloads']}, gaps {g['gaps']}, stale dropped by consumer"
        f" {f['stale_dropped_by_consumer']}, delivered late {f['delivered_late']}, unaccounted {f['unaccounted']},"
        f" lost undetected {f['explained']['lost_undetected']}; other processes {other_cores(r):.2f} cores"
    )
for r in load("issue8-steady"):
    g = r["ingress"]
    rnd = g["confirm_round_ms"] or {}
    lines.append(
        f"- steady {r['streams']} {r['design']}: overloads {g['overloads']}, gaps {g['gaps']},"
        f" unconfirmed_bytes_max {g['unconfirmed_bytes_max']} (window limit max {g['window_limit_bytes_max']},"
        f" at the end {g['window_limit_bytes']}), confirm round p50 / p99 / max"
        f" {rnd.get('p50', 0):.2f} / {rnd.get('p99', 0):.2f} / {rnd.get('max', 0):.2f} ms over {rnd.get('count', 0)} rounds;"
        f" other processes {other_cores(r):.2f} cores"
    )
print("\n".join(lines))
EOF2
    {
        echo "<!-- issue8:begin -->"
        echo "Generated by \`loadtest/results.sh issue8\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit"
        echo "\`$(git rev-parse --short HEAD)\`$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (built from a working tree with uncommitted changes)'),"
        echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')),"
        echo "$("$NATS_SERVER_BIN" --version 2>/dev/null | head -n1), release build;"
        echo "load average before the runs: $load_before; each run waited up to ${wait_quiet} s for a quiet machine."
        echo "The consumers' staleness guard runs at its default (max_frame_age_ms = 1000)."
        echo "JSON: [loadtest/results/issue8-*.json](../loadtest/results/)."
        echo
        cat "$md/issue8.md"
        echo
        echo "#### \`loadtest nats-pause --streams 1,10,50 --design both\`"
        cat "$md/pause.md"
        echo
        echo "#### \`loadtest steady --streams 1,10,50 --design bounded\`"
        cat "$md/steady.md"
        echo "<!-- issue8:end -->"
    } >"$md/section.md"
    splice_section issue8
    echo "updated docs/loadtest.md (issue8 block) and $out/issue8-*" >&2
    exit 0
fi

if [[ "${1:-}" == "issue13" ]]; then
    rm -f "$out"/issue13-*
    failover() {
        local name="$1"
        shift
        printf '\n==> loadtest %s\n' "$*" >&2
        "$lt" "$@" -q --json "$out/issue13-$name.json" --markdown "$out/issue13-$name.md" >/dev/null
    }
    failover worker-failover worker-failover --streams 200,200,200
    failover worker-failover-50fps worker-failover --streams 200,200 --fps 50
    failover node-failover-ttl10 node-failover --streams 200,200,200 --lease-ttl-ms 10000
    failover node-failover-ttl15 node-failover --streams 200,200,200
    failover node-failover-down20-ttl10 node-failover --streams 200,200 --pause 20 --duration 26 --lease-ttl-ms 10000
    failover node-failover-down20-ttl15 node-failover --streams 200,200 --pause 20 --duration 26
    echo "wrote $out/issue13-* (load average before: $load_before, after: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    exit 0
fi

# Everything but the issue8 and issue13 files (regenerated by `results.sh issue8` and
# `results.sh issue13`).
mkdir -p "$out/plots"
# Only what this run rewrites goes: the per-issue measurements (issue*) are kept.
find "$out" -mindepth 1 -maxdepth 1 ! -name 'issue*' ! -name plots -exec rm -rf {} +
find "$out/plots" -mindepth 1 -maxdepth 1 ! -name 'issue8*' -exec rm -rf {} +

run() {
    local name="$1"
    shift
    printf '\n==> loadtest %s\n' "$*" >&2
    "$lt" "$@" -q --wait-quiet 30 --json "$out/$name.json" --markdown "$md/$name.md" --plot "$out/plots/$name" >/dev/null
    printf '%s\n' "$*" >"$md/$name.cmd"
}

run showcase showcase
run nats-pause-5s nats-pause --streams 50 --pause 5
run nats-pause-10s nats-pause --streams 50 --pause 10
run nats-pause-10s-no-reconnect nats-pause --streams 50 --pause 10 --no-reconnect
run all all --streams 10,50
run ceiling ceiling

# The figures the issue's "Done when" asks for, read from the JSON just written.
python3 - "$out" >"$md/summary.md" <<'EOF'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
def load(name):
    return json.loads((out / f"{name}.json").read_text())
def mib(b):
    return f"{b / 1048576:.1f} MiB"
lines = []
for name in ("nats-pause-5s", "nats-pause-10s", "nats-pause-10s-no-reconnect"):
    for r in load(name):
        i, f = r["ingress"], r["frames"]
        limit = i["pending_bytes_limit"]
        lines.append(
            f"- `{name}` {r['design']}: pending_bytes_max {i['pending_bytes_max']:,}"
            f" (limit {'none' if limit is None else f'{limit:,}'}),"
            f" RSS before the pause {mib(i['rss_before_fault_bytes'] or 0)}, peak {mib(i['rss_peak_bytes'])},"
            f" tasks_max {i['tasks_max']:,} for {f['offered']:,} frames offered"
            f" ({r['producers']['connects']} connections),"
            f" queue wait p99 {i['queue_wait_ms']['p99']:.1f} ms"
        )
rows = load("all")
bounded = [r for r in rows if r["design"] == "bounded"]
for r in bounded:
    f = r["frames"]
    e = f["explained"]
    lines.append(
        f"- `all` {r['scenario']} {r['streams']} bounded: unaccounted {f['unaccounted']}"
        f" (lost after publish {e['lost_after_publish']}, consumer-detected holes {e['consumer_detected_holes']},"
        f" dropped with a reason {f['dropped']}, pending at end {e['pending_at_end']})"
    )
for r in rows:
    if r["llm"]["enabled"]:
        l = r["llm"]
        lines.append(
            f"- `all` {r['scenario']} {r['streams']} {r['design']}: LLM offered {l['offered']}, completed {l['completed']},"
            f" refused {l['refused']} {l['refused_by_code']}, caller timeouts {l['caller_timeouts']},"
            f" started_after_deadline {l['started_after_deadline']}, goodput {l['goodput_per_s']:.1f}/s"
        )
c = load("ceiling")
if c:
    lines.append(f"- `ceiling` bounded: max_streams {c[-1]['max_streams']}; limited by: {'; '.join(c[-1]['ceiling']['limited_by'])}")
print("\n".join(lines))
EOF

{
    echo "<!-- results:begin -->"
    echo "Generated by \`loadtest/results.sh\` on $(date -u '+%Y-%m-%d %H:%M UTC'), commit"
    echo "\`$(git rev-parse --short HEAD)\`$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (built from a working tree with uncommitted changes)'),"
    echo "$(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')),"
    echo "$("$NATS_SERVER_BIN" --version 2>/dev/null | head -n1), release build;"
    echo "load average before the runs: $load_before (anything else running on the 2 cores lowers these figures)."
    echo "JSON reports and charts: [loadtest/results/](../loadtest/results/)."
    echo
    echo "### The figures the issue asks for"
    echo
    cat "$md/summary.md"
    for name in showcase nats-pause-5s nats-pause-10s nats-pause-10s-no-reconnect all ceiling; do
        echo
        echo "### \`loadtest $(cat "$md/$name.cmd")\`"
        cat "$md/$name.md"
    done
    echo "<!-- results:end -->"
} >"$md/section.md"

splice_section results
echo "updated docs/loadtest.md and $out" >&2
