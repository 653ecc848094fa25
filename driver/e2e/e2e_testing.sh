# Shared helpers of the train_* end-to-end tests (sourced; needs $TMP, and
# runs under $TMP/runs as the tests' --output_dir).
#   losses NAME        "step loss" lines of run NAME's metrics.jsonl, by step
#   close_losses WANT GOT WHAT [RTOL]
#                      the same steps, each loss within RTOL relative
#                      (default 1e-5); prints the largest difference
#   skip_test NAME WHY  prints "SKIPPED, NOT RUN: WHY", records test NAME as
#                      skipped in Bazel's JUnit XML and exits 0 (only for a
#                      test whose own rule says when it may skip)

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
