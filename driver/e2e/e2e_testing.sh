# Shared helpers of the train_* end-to-end tests (sourced; runs go under
# $TMP/runs as the tests' --output_dir). Sourcing also sets what every test
# starts with: one OpenMP and BLAS thread per rank (the ranks split the
# machine's cores), and TMP, Bazel's test temp dir (else a new one).
#   write_corpus FILE [TAIL]
#                      the tests' small corpus: 300 lines "Pipeline stage N
#                      sends activations to the next stage.TAIL" (TAIL: " The
#                      bubble shrinks." unless given)
#   must_run LOG CMD...  runs CMD with its output in LOG; when it fails, prints
#                      LOG and "FAIL: CMD exited non-zero" and exits 1
#   losses NAME        "step loss" lines of run NAME's metrics.jsonl, by step
#   close_losses WANT GOT WHAT [RTOL]
#                      the same steps, each loss within RTOL relative
#                      (default 1e-5); prints the largest difference
#   skip_test NAME WHY  prints "SKIPPED, NOT RUN: WHY", records test NAME as
#                      skipped in Bazel's JUnit XML and exits 0 (only for a
#                      test whose own rule says when it may skip)

export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
TMP=${TEST_TMPDIR:-$(mktemp -d)}

write_corpus() {
  local tail=${2- The bubble shrinks.}
  for i in $(seq 1 300); do
    echo "Pipeline stage $((i % 5)) sends activations to the next stage.$tail"
  done > "$1"
}

must_run() {
  local log=$1; shift
  "$@" > "$log" 2>&1 || { cat "$log"; echo "FAIL: $* exited non-zero"; exit 1; }
}

losses() {
  cat "$TMP"/runs/"$1"-*/metrics.jsonl | sed -E 's/^\{.*"loss":([^,}]*).*"step":([0-9]+).*$/\2 \1/' |
    sort -n
}

close_losses() {
  python3 - "$1" "$2" "$3" "${4:-1e-5}" <<'PY'
import sys
a = dict(l.split() for l in sys.argv[1].splitlines())
b = dict(l.split() for l in sys.argv[2].splitlines())
rtol = float(sys.argv[4])
assert a and a.keys() == b.keys(), (sorted(a), sorted(b))
worst = max(abs(float(a[k]) - float(b[k])) / abs(float(a[k])) for k in a)
print(f"{sys.argv[3]}: {len(a)} steps, largest relative loss difference {worst:.2e} (at most {rtol:g})")
assert worst <= rtol, worst
PY
}

skip_test() {
  local name=$1; shift
  echo "SKIPPED, NOT RUN: $*"
  if [[ -n ${XML_OUTPUT_FILE:-} ]]; then
    cat > "$XML_OUTPUT_FILE" << XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1" failures="0" errors="0" skipped="1">
  <testsuite name="${name}_test" tests="1" failures="0" errors="0" skipped="1">
    <testcase name="$name" classname="${name}_test"><skipped message="${*//[\"<>&]/}"/></testcase>
  </testsuite>
</testsuites>
XML
  fi
  exit 0
}
