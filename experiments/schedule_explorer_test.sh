#!/usr/bin/env bash
# Runs the explorer's formats end to end and checks their content.
set -euo pipefail
explorer="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

fail() { echo "FAIL: $*" >&2; exit 1; }

# --format=json: exactly one JSON object with the documented keys and values.
"$explorer" --schedule=1f1b --stages=4 --microbatches=8 --format=json > "$tmp/out.json"
python3 - "$tmp/out.json" <<'PY'
import json, sys
text = open(sys.argv[1]).read()
obj = json.loads(text)  # raises on anything but one JSON document
assert obj["schedule"] == "1f1b" and obj["stages"] == 4, obj
assert obj["microbatches"] == 8 and obj["chunks"] == 1, obj
assert obj["ranks"][0]["rank"] == 0
assert obj["ranks"][0]["actions"][:4] == ["0F0", "0F1", "0F2", "0F3"], obj["ranks"][0]
assert obj["lowered"][3]["actions"][-1] == "STEP", obj["lowered"][3]
sim = obj["simulation"]
assert sim["makespan"] == 33, sim
assert abs(sim["bubble_fraction"] - 3 / 11) < 1e-12, sim
assert sim["peak_inflight"] == [4, 3, 2, 1], sim
assert sim["busy"] == [24, 24, 24, 24], sim
assert obj["stage_to_rank"] == {"0": 0, "1": 1, "2": 2, "3": 3}, obj["stage_to_rank"]
PY

# zbv: V placement in the JSON; the bottom of the V (stages 1 and 2 for p = 2)
# hands over on rank 1 without a message.
"$explorer" --schedule=zbv --stages=2 --microbatches=4 --chunks=2 --format=json > "$tmp/zbv.json"
python3 - "$tmp/zbv.json" <<'PY'
import json, sys
obj = json.load(open(sys.argv[1]))
assert obj["stage_to_rank"] == {"0": 0, "1": 1, "2": 1, "3": 0}, obj["stage_to_rank"]
lowered = obj["lowered"][1]["actions"]
assert not any(a.startswith("1SEND_F") or a.startswith("2RECV_F") for a in lowered), lowered
assert any(a.startswith("2SEND_F") for a in lowered), lowered
PY

# --defer_receives: the program the runtime executes (DeferReceives), each
# receive moved to just before its consumer; same actions, same makespan here.
"$explorer" --schedule=1f1b --stages=4 --microbatches=8 --format=json --defer_receives \
  > "$tmp/deferred.json"
python3 - "$tmp/out.json" "$tmp/deferred.json" <<'PY'
import json, sys
lowered, deferred = (json.load(open(f)) for f in sys.argv[1:3])
a, b = lowered["lowered"][1]["actions"], deferred["lowered"][1]["actions"]
assert a[:4] == ["1RECV_F0", "1F0", "1RECV_F1", "1SEND_F0"], a[:4]
assert b[:5] == ["1RECV_F0", "1F0", "1SEND_F0", "1RECV_F1", "1F1"], b[:5]
assert sorted(a) == sorted(b)
assert deferred["simulation"]["makespan"] == lowered["simulation"]["makespan"] == 33
PY

"$explorer" --schedule=interleaved_1f1b --stages=4 --microbatches=8 --chunks=2 \
  --format=svg --out="$tmp/t.svg" 2>/dev/null
grep -q '</svg>' "$tmp/t.svg" || fail "svg not written"
grep -q 'rank 3' "$tmp/t.svg" || fail "svg lacks rank rows"

"$explorer" --schedule=gpipe --stages=2 --microbatches=4 --format=chrome > "$tmp/t.json"
python3 -c "import json,sys; t=json.load(open(sys.argv[1])); assert sum(e['ph']=='X' for e in t['traceEvents']) >= 16" "$tmp/t.json"

[[ "$("$explorer" --schedule=gpipe --stages=2 --microbatches=2 --format=csv)" == \
   $'0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1' ]] || fail "csv"

# CSV files: both forms written, read back with --schedule=csv:FILE (shape from
# the file), written again identically; zbv's V placement travels in the
# '# stage_to_rank: v' line or the --stage_to_rank flag.
"$explorer" --schedule=zbv --stages=2 --microbatches=4 --chunks=2 --format=csv > "$tmp/zbv.csv"
"$explorer" --schedule=zbv --stages=2 --microbatches=4 --chunks=2 --format=csv_comms \
  > "$tmp/zbv_comms.csv"
[[ "$(head -1 "$tmp/zbv.csv")" == "# stage_to_rank: v" ]] || fail "csv placement line"
grep -q '^0F0,1SEND_F0\|^0F0,0SEND_F0' "$tmp/zbv_comms.csv" || fail "csv_comms: $(cat "$tmp/zbv_comms.csv")"
grep -q 'STEP' "$tmp/zbv_comms.csv" && fail "csv_comms has pipe's STEP (PyTorch cannot read it)"
cmp <("$explorer" --schedule=csv:"$tmp/zbv.csv" --format=csv) "$tmp/zbv.csv" || fail "csv round trip"
cmp <("$explorer" --schedule=csv:"$tmp/zbv_comms.csv" --format=csv_comms) "$tmp/zbv_comms.csv" \
  || fail "csv_comms round trip"
cmp <("$explorer" --schedule=csv:"$tmp/zbv_comms.csv" --format=csv) "$tmp/zbv.csv" \
  || fail "csv_comms -> csv"
tail -n +2 "$tmp/zbv.csv" > "$tmp/zbv_noline.csv"
"$explorer" --schedule=csv:"$tmp/zbv_noline.csv" --stage_to_rank=v --format=json > "$tmp/zbvcsv.json"
python3 - "$tmp/zbv.json" "$tmp/zbvcsv.json" <<'PY'
import json, sys
made, loaded = (json.load(open(f)) for f in sys.argv[1:3])
assert loaded["stage_to_rank"] == made["stage_to_rank"], loaded["stage_to_rank"]
assert loaded["lowered"] == made["lowered"]
assert loaded["simulation"]["makespan"] == made["simulation"]["makespan"]
PY
printf '0F0,0B0\n1F0,1X0\n' > "$tmp/bad.csv"
if "$explorer" --schedule=csv:"$tmp/bad.csv" 2> "$tmp/bad.err"; then fail "bad csv accepted"; fi
grep -q 'line 2, column 2 (rank 1): "1X0"' "$tmp/bad.err" || fail "bad csv: $(cat "$tmp/bad.err")"
grep -q '\[1X0\]   <-- here' "$tmp/bad.err" || fail "bad csv grid: $(cat "$tmp/bad.err")"

"$explorer" --list | grep -q '^interleaved_1f1b' || fail "--list"
"$explorer" --compare=gpipe,1f1b,interleaved_1f1b --chunks=2 > "$tmp/cmp.txt"
grep -qE '^1f1b +1 +33 ' "$tmp/cmp.txt" || fail "compare: $(cat "$tmp/cmp.txt")"
grep -qE '^interleaved_1f1b +2 ' "$tmp/cmp.txt" || fail "compare lacks interleaved"

# Zero-bubble schedules: I/W costs (B defaults to I + W), the memory model per
# rank in the JSON, the settable split, and the compare table.
"$explorer" --schedule=zb_h1 --stages=4 --microbatches=8 --costs=F:1,I:1,W:1 --format=json \
  > "$tmp/zb.json"
"$explorer" --schedule=zb_h1 --stages=4 --microbatches=8 --costs=F:1,I:1,W:1 --format=json \
  --memory_split=I:0,W:1 > "$tmp/zb_nofree.json"
python3 - "$tmp/zb.json" "$tmp/zb_nofree.json" <<'PY'
import json, sys
zb, nofree = (json.load(open(f))["simulation"] for f in sys.argv[1:3])
assert zb["makespan"] == 27 and zb["peak_inflight"] == [4, 4, 4, 4], zb
assert abs(zb["peak_memory"][3] - (1 + 3 * 32 / 74)) < 1e-9, zb["peak_memory"]
assert zb["memory_split"] == {"I": 42, "W": 32}, zb
assert zb["inner_idle"] == [3, 2, 1, 0], zb
assert nofree["peak_memory"] == [4, 4, 4, 4], nofree
PY
# The byte planner: 1 MiB of parameters, 10 of activations, 0.25 boundary per
# stage at p = 2, m = 4: 1F1B's rank 0 peaks at F3 holding 2 micro-batches:
# 20 + 1 + 1 + 2 (AdamW) + 0.25 (a gradient's receive buffer) + 0.5 (2 outputs
# sent, live until the tail) = 24.75 MiB; GPipe's rank 1 keeps all 4 and their
# 4 received inputs: 40 + 4 + 1 = 45. A bad key exits 2.
"$explorer" --schedule=1f1b --stages=2 --microbatches=4 --stage_bytes=params:1,act:10,boundary:0.25 > "$tmp/bytes.txt"
grep -q "^rank 0: peak 24.75 MiB = activations 20.00 MiB" "$tmp/bytes.txt" || fail "byte plan: $(cat "$tmp/bytes.txt")"
"$explorer" --compare=gpipe,1f1b --stages=2 --microbatches=4 --stage_bytes=params:1,act:10,boundary:0.25 > "$tmp/bytescmp.txt"
grep -qE "^gpipe .* 45.00$" "$tmp/bytescmp.txt" || fail "byte column: $(cat "$tmp/bytescmp.txt")"
set +e
"$explorer" --schedule=1f1b --stage_bytes=foo:1 > /dev/null 2> "$tmp/badbytes.txt"
code=$?
set -e
[[ $code -eq 2 ]] && grep -q "unknown key 'foo'" "$tmp/badbytes.txt" || fail "bad --stage_bytes: exit $code $(cat "$tmp/badbytes.txt")"

"$explorer" --compare=1f1b,zb_h1,zb_h2 --costs=F:1,I:1,W:1 > "$tmp/zbcmp.txt"
grep -qE '^1f1b +1 +33 +27.3% +13.6% ' "$tmp/zbcmp.txt" || fail "zb compare: $(cat "$tmp/zbcmp.txt")"
grep -qE '^zb_h1 +1 +27 +11.1% +5.6% +\[4,4,4,4\] +4 +\[4,3.43,2.86,2.3\]$' "$tmp/zbcmp.txt" \
  || fail "zb_h1 row: $(cat "$tmp/zbcmp.txt")"
grep -qE '^zb_h2 +1 +27 +11.1% +0.0% +\[7,7,7,7\] ' "$tmp/zbcmp.txt" \
  || fail "zb_h2 row: $(cat "$tmp/zbcmp.txt")"
if "$explorer" --schedule=zb_h1 --memory_split=I:0,W:0 2> "$tmp/err.txt"; then
  fail "accepted a zero memory split"
fi
grep -q 'I + W must be > 0' "$tmp/err.txt" || fail "memory split error: $(cat "$tmp/err.txt")"

# Tail, per-stage and send costs (hand-computed in simulator_test): gpipe,
# p = 2, m = 2 ends its computes at 9 (rank 0) and 7 (rank 1); REDUCE_TIED
# gathers both at 9, then 0.25 + 0.5 + rank 1's STEP 5 = 14.75. Stage 1's own
# F = 3: 13. Without tie groups and with STEP all-reducing: 14.5.
sim() { "$explorer" --schedule=gpipe --stages=2 --microbatches=2 --format=json "$@" |
  python3 -c 'import json, sys; print("%g" % json.load(sys.stdin)["simulation"]["makespan"])'; }
tail_costs=(--costs=F:1,B:2,STEP:1,REDUCE_TIED:0.25,REDUCE_GRAD:0.5 --rank_costs='1:STEP:5')
[[ "$(sim "${tail_costs[@]}")" == 14.75 ]] || fail "tail costs: $(sim "${tail_costs[@]}")"
[[ "$(sim "${tail_costs[@]}" --tie_groups=none --step_all_reduce)" == 14.5 ]] ||
  fail "step all-reduce: $(sim "${tail_costs[@]}" --tie_groups=none --step_all_reduce)"
[[ "$(sim --stage_costs='1:F:3')" == 13 ]] || fail "stage costs: $(sim --stage_costs='1:F:3')"
[[ "$(sim --costs=F:1,B:2,SEND:0.5)" == 11 ]] || fail "send cost: $(sim --costs=F:1,B:2,SEND:0.5)"
[[ "$(sim --costs=F:1,B:2,RECV:0.5 --rank_costs='0:RECV:0')" == 10 ]] ||
  fail "recv cost: $(sim --costs=F:1,B:2,RECV:0.5 --rank_costs='0:RECV:0')"
for bad in --stage_costs='5:F:1' --stage_costs='0:STEP:1' --rank_costs='0:F:1' --tie_groups=0; do
  if "$explorer" --schedule=gpipe --stages=2 --microbatches=2 "$bad" 2> "$tmp/err.txt"; then
    fail "accepted $bad"
  fi
  grep -qE 'stage 5|"STEP"|"F"|fewer than 2' "$tmp/err.txt" || fail "$bad: $(cat "$tmp/err.txt")"
done

# Rejected options: a message naming the rule, non-zero exit.
if "$explorer" --schedule=interleaved_1f1b --stages=4 --microbatches=6 --chunks=2 \
     2> "$tmp/err.txt"; then
  fail "accepted m=6 with p=4"
fi
grep -q 'm % g >= p' "$tmp/err.txt" || fail "error lacks the rule"
# --synthesize: p = 4, m = 4, F = I = W = 1 with twice 1F1B's memory: the
# zero-bubble authors' ZB-2p makespan, 15, which is the lower bound of one
# chunk per rank; next to every registered schedule, none of that shape under
# the cap faster. (Two chunks are another shape with a lower bound of its own:
# vhalf's halves start the last rank sooner and take 14.5.)
"$explorer" --synthesize --stages=4 --microbatches=4 --costs=F:1,I:1,W:1 --memory_cap=8 \
  --compare=all --max_evaluations=200 > "$tmp/synth.txt"
python3 - "$tmp/synth.txt" <<'PY'
import sys
lines = open(sys.argv[1]).read().splitlines()
rows = {l.split()[0]: l for l in lines[2:] if l and not l.startswith("memory cap")}
synth = float(rows["synthesized"].split()[2])
assert synth == 15, rows["synthesized"]
assert "lower bound 15; synthesized 15" in lines[-1], lines[-1]
for name, row in rows.items():
    fields = row.split()
    if name == "synthesized" or "over the cap" in row or fields[1] != "1":
        continue
    assert float(fields[2]) >= synth, row
assert "1f1b" in rows and "zb_h2" in rows, rows.keys()
PY
# Text: the grid, the figures and the lower bound with its gap; a heavier
# last stage (stage_costs) under 1F1B's cap (the default).
"$explorer" --synthesize --stages=4 --microbatches=8 --stage_costs='3:F:1.5,I:1.5,W:1.5' \
  --max_evaluations=200 > "$tmp/synth_text.txt"
grep -q 'compute order (step x rank)' "$tmp/synth_text.txt" || fail "synthesize: no grid"
grep -qE '^makespan [0-9.]+  bubble' "$tmp/synth_text.txt" || fail "synthesize: no makespan"
grep -qE '^memory cap 4 \(x stage\)  peak memory [0-9.]+' "$tmp/synth_text.txt" ||
  fail "synthesize: no cap/peak line"
grep -qE '^lower bound [0-9.]+ \(busiest rank [0-9.]+, critical path [0-9.]+\): gap' \
  "$tmp/synth_text.txt" || fail "synthesize: no lower bound"
# CSV and SVG like any schedule; the CSV read back simulates the same.
"$explorer" --synthesize --stages=4 --microbatches=8 --chunks=2 --placement=v --format=csv \
  --max_evaluations=100 --out="$tmp/synth.csv" 2>/dev/null
"$explorer" --synthesize --stages=4 --microbatches=8 --chunks=2 --placement=v --format=json \
  --max_evaluations=100 > "$tmp/synth.json"
"$explorer" --schedule="csv:$tmp/synth.csv" --format=json > "$tmp/synth_back.json"
python3 - "$tmp/synth.json" "$tmp/synth_back.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
assert a["stage_to_rank"] == {"0": 0, "1": 1, "2": 2, "3": 3, "4": 3, "5": 2, "6": 1, "7": 0}, a
assert a["ranks"] == b["ranks"], (a["ranks"], b["ranks"])
assert a["simulation"]["makespan"] == b["simulation"]["makespan"], (a, b)
assert max(a["simulation"]["peak_memory"]) <= 8 + 1e-9, a["simulation"]
PY
"$explorer" --synthesize --stages=2 --microbatches=4 --format=svg --out="$tmp/synth.svg" \
  2>/dev/null
grep -q '</svg>' "$tmp/synth.svg" || fail "synthesize: svg not written"
# A cap below one activation per local stage, or a bad placement: named.
if "$explorer" --synthesize --stages=4 --microbatches=8 --memory_cap=0.5 2> "$tmp/err.txt"; then
  fail "synthesize accepted a cap of 0.5"
fi
grep -q 'memory_cap (0.5) is below the minimum' "$tmp/err.txt" || fail "cap: $(cat "$tmp/err.txt")"
if "$explorer" --synthesize --placement=w 2> "$tmp/err.txt"; then
  fail "synthesize accepted --placement=w"
fi
grep -q -- '--placement=w: expected looped or v' "$tmp/err.txt" || fail "$(cat "$tmp/err.txt")"
# Issue #42 class 8: out-of-bound shapes (a bad_alloc, or minutes of
# synthesis with no output), costs whose sum overflows (makespan inf), and
# every refusal: "error: ..." and exit 2 like the training binaries, quickly.
while IFS='|' read -r expected args; do
  [[ -z "$expected" ]] && continue
  code=0
  # shellcheck disable=SC2086  # args are several flags
  timeout 30 "$explorer" $args > /dev/null 2> "$tmp/err.txt" || code=$?
  [[ $code -eq 2 ]] || fail "$args: exit $code (want 2): $(cat "$tmp/err.txt")"
  head -1 "$tmp/err.txt" | grep -q '^error: ' || fail "$args: no error: line: $(cat "$tmp/err.txt")"
  grep -qF -- "$expected" "$tmp/err.txt" || fail "$args: $(cat "$tmp/err.txt")"
done <<'CASES'
--stages (2147483647) must be at most 1024|--stages=2147483647
--stages (0) must be at least 1 and at most 1024|--stages=0
--microbatches (1000000) must be at most 65536|--synthesize --microbatches=1000000
--stages (1024) x --microbatches (65536) x --chunks (1) = 67108864 compute actions per kind; the explorer takes at most 1048576|--stages=1024 --microbatches=65536
--stages (1000) x --microbatches (64) x --chunks (1) = 64000 compute actions per kind; --synthesize takes at most 32768|--synthesize --stages=1000 --microbatches=64
--chunks (0) must be at least 1|--chunks=0
--max_evaluations (-1) must not be negative|--synthesize --max_evaluations=-1
bad cost "F:1e308" in "F:1e308,B:1e308": expected KEY:VALUE|--costs=F:1e308,B:1e308
bad cost "F:1e308"|--compare=1f1b,gpipe --costs=F:1e308,B:1e308
bad cost "F:1e13"|--synthesize --stage_costs=0:F:1e13
m % g >= p|--schedule=interleaved_1f1b --stages=4 --microbatches=6 --chunks=2
--format=xml: expected text|--format=xml
--placement=w: expected looped or v|--synthesize --placement=w
micro-batch multiplier "x" in "1,x" is not a finite number >= 0|--microbatch_multiplier=1,x
microbatch_multiplier has 2 entries; the program has 8 micro-batches|--microbatch_multiplier=1,2
CASES
# Per-micro-batch multipliers: GPipe at p 2, m 4, F 1, B 2 with 2, 0.5, 1, 3
# (the simulator's unit test works the makespan out).
out=$("$explorer" --schedule=gpipe --stages=2 --microbatches=4 --costs=F:1,B:2 \
  --microbatch_multiplier=2,0.5,1,3) || fail "multipliers: exit $?"
grep -q 'makespan 28.5 ' <<<"$out" || fail "multipliers: $out"
echo PASS
