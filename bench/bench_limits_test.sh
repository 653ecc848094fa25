#!/usr/bin/env bash
# bench_limits.py at a tiny size (a 4-block GPT of width 64, 1 repetition of 2
# timed steps, 8 MiB copies): every JSON field present and sane (positive
# throughputs, ratios in range, bounds consistent with their inputs, each
# pp = 2 run's threads grouped with one compute thread per rank), and bad
# arguments refused naming the value. Never a timing threshold.
set -euo pipefail
TRAIN_GPT=$1
MEMCPY=$2
DRIVER=$3
TMP=${TEST_TMPDIR:-$(mktemp -d)}
export TMPDIR=$TMP

# Bad input: the flag and its value in the message.
if "$MEMCPY" --bytes=10 > "$TMP/bad.out" 2> "$TMP/bad.err"; then
  echo "FAIL: bench_memcpy --bytes=10 succeeded"; exit 1
fi
grep -q -- "--bytes=10 must be >= 4096" "$TMP/bad.err" || { cat "$TMP/bad.err"; echo "FAIL: bytes message"; exit 1; }
if "$MEMCPY" --start_at=12 > "$TMP/bad.out" 2> "$TMP/bad.err"; then
  echo "FAIL: bench_memcpy --start_at=12 succeeded"; exit 1
fi
grep -q -- "--start_at=12 must be 0 or a Unix time within 60 s" "$TMP/bad.err" ||
  { cat "$TMP/bad.err"; echo "FAIL: start_at message"; exit 1; }
for bad in "--reps=0" "--steps=0" "--warmup=0" "--pp2=1f1b" "--deepspeed_tokens_per_s=-3"; do
  if python3 "$DRIVER" --train_gpt="$TRAIN_GPT" --bench_memcpy="$MEMCPY" "$bad" \
      > "$TMP/bad.out" 2> "$TMP/bad.err"; then
    echo "FAIL: bench_limits.py $bad succeeded"; exit 1
  fi
  grep -q -- "${bad#--}" "$TMP/bad.err" || grep -q -- "$bad" "$TMP/bad.err" ||
    { cat "$TMP/bad.err"; echo "FAIL: $bad not named"; exit 1; }
done

python3 "$DRIVER" --train_gpt="$TRAIN_GPT" --bench_memcpy="$MEMCPY" --reps=1 --steps=2 \
  --warmup=1 --tail_steps=100 --microbatches=4 --micro_batch_size=4 \
  --model_set=gpt.width=64,gpt.num_layers=4,gpt.num_heads=2,gpt.context_length=64 \
  --copy_bytes=8388608 --copy_seconds=0.3 --deepspeed_tokens_per_s=1000 \
  --deepspeed_source=test > "$TMP/out.json" 2> "$TMP/err.txt" ||
  { cat "$TMP/err.txt"; echo "FAIL: bench_limits.py exited non-zero"; exit 1; }
cat "$TMP/err.txt"
python3 - "$TMP/out.json" "$TMP/err.txt" <<'PY' || { echo "FAIL: bench_limits JSON"; exit 1; }
import json, math, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines  # one JSON line on stdout, the table on stderr
r = json.loads(lines[0])
table = open(sys.argv[2]).read()
assert "limits on this machine" in table and "pp=2 1f1b" in table and "pp=2 zbv" in table, table
assert r["bench"] == "limits" and r["reps"] == 1 and r["microbatches"] == 4, r
assert r["tokens_per_step"] == 4 * 4 * 64, r["tokens_per_step"]
assert r["cores"] >= 1 and len(r["load_average"]["start"]) == 3

def positive(x, what):
    assert isinstance(x, (int, float)) and x > 0 and math.isfinite(x), (what, x)

def in_range(x, lo, hi, what):
    assert lo < x <= hi, (what, x)

def check_run(run, ranks, what):
    positive(run["tokens_per_s"], what)
    positive(run["step_s"], what)
    assert run["runs_tokens_per_s"] and all(t > 0 for t in run["runs_tokens_per_s"]), what
    # CPU of the run's threads over the cores' time: a share of the machine.
    in_range(run["cores_busy"], 0, 1.25, what)
    groups = run["thread_groups_per_step"]
    assert groups["compute"]["threads"] == ranks, (what, groups)
    positive(groups["compute"]["cpu_s"], what)
    assert "launcher" in groups, (what, groups)
    for g, v in groups.items():
        assert v["cpu_s"] >= 0 and v["wait_s"] >= 0 and v["threads"] >= 1, (what, g, v)
    total = sum(v["cpu_s"] for v in groups.values())
    assert abs(total - run["cpu_s_per_step"]) <= 1e-3 + 1e-3 * total, (what, total, run)
    assert len(run["per_rank_cpu_s"]) == ranks and len(run["compute_share"]) == ranks, what
    for share in run["compute_share"]:
        in_range(share, 0, 1.25, what)
    if run["labelled_by"] == "gdb":
        # Gloo's TCP loop runs in every rank (pp=1 too: the process group
        # exists); ProcessGroupGloo's work threads too.
        assert groups["gloo_transport"]["threads"] == ranks, (what, groups)
        assert "c10d_gloo_workers" in groups, (what, groups)
    else:
        assert run["labelled_by"] == "main thread only", run["labelled_by"]
        assert set(groups) <= {"compute", "launcher", "other"}, (what, groups)
    assert run["threads"] == ["1 intra-op + 1 BLAS thread(s)"], (what, run["threads"])

check_run(r["single"], 1, "single")
for name in ("1f1b", "zbv"):
    check_run(r["pp2"][name], 2, name)
two = r["two_singles"]
assert len(two["tokens_per_s"]) == 2
for t in two["tokens_per_s"]:
    positive(t, "two_singles")
assert abs(two["sum_tokens_per_s"] - sum(two["tokens_per_s"])) < 0.2, two
in_range(two["sharing_ratio"], 0, 10, "two_singles ratio")
assert abs(two["sharing_ratio"] - two["sum_tokens_per_s"] / 2 / r["single"]["tokens_per_s"]) < 2e-3
assert set(two["thread_groups_per_step"]) >= {"compute", "launcher"}, two
in_range(two["cpu_ratio"], 0, 10, "two_singles cpu ratio")
copy = r["copy"]
assert copy["bytes"] == 8388608
positive(copy["alone_gb_per_s"], "copy")
for g in copy["pair_gb_per_s"]:
    positive(g, "copy pair")
in_range(copy["sharing_ratio"], 0, 10, "copy ratio")
b = r["bounds"]
assert b["ceiling_tokens_per_s"] == two["sum_tokens_per_s"] == b["no_bubble_tokens_per_s"], b
assert abs(b["one_f_one_b_factor"] - 4 / 5) < 1e-9, b  # m / (m + p - 1), m = 4, p = 2
assert abs(b["one_f_one_b_tokens_per_s"] - b["ceiling_tokens_per_s"] * 0.8) < 0.2, b
f = r["fractions"]
assert set(f) == {"1f1b", "zbv", "deepspeed"}, f
for name in ("1f1b", "zbv"):
    tps = r["pp2"][name]["tokens_per_s"]
    assert abs(f[name]["of_ceiling"] - tps / b["ceiling_tokens_per_s"]) < 1e-3, f
    assert abs(f[name]["of_1f1b_bound"] - tps / b["one_f_one_b_tokens_per_s"]) < 1e-3, f
    assert abs(f[name]["vs_deepspeed"] - tps / 1000) < 1e-3, f
    run = r["pp2"][name]
    assert abs(f[name]["cpu_vs_single"] - run["cpu_s_per_step"] / r["single"]["cpu_s_per_step"]) < 2e-3, f
    want = r["tokens_per_step"] * r["cores"] / run["cpu_s_per_step"]
    assert abs(f[name]["cpu_bound_tokens_per_s"] - want) <= 0.01 * want, (f, want)
assert f["deepspeed"]["source"] == "test" and f["deepspeed"]["tokens_per_s"] == 1000
print("bench_limits JSON OK")
PY
echo PASS
