#!/usr/bin/env bash
# Fails if a test of pipe's own packages is missing from //:all_tests, or
# //:fast holds a test that //:all_tests does not (the root BUILD.bazel lists
# tests by hand: Bazel has no recursive test_suite, so this keeps the lists from
# going stale). A researcher's own package (examples/ stands for one) needs no
# edit here: `./bazelw test //...` runs its tests whether listed or not.
# Usage: tools/check_test_suites.sh [bazel]
set -euo pipefail
cd "$(dirname "$0")/.."
bazel="${1:-./bazelw}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
# query EXPR: the labels it matches; on a Bazel error, its output and exit 2.
query() {
  "$bazel" query --noshow_progress "$1" 2>"$log" || {
    cat "$log" >&2
    echo "check_test_suites: bazel query '$1' failed (a test listed in BUILD.bazel" \
      "may have moved or been deleted)" >&2
    exit 2
  }
}
missing="$(query 'tests(//...) except tests(//:all_tests) except tests(//examples/...)')"
extra="$(query 'tests(//:fast) except tests(//:all_tests)')"
status=0
if [[ -n "$missing" ]]; then
  echo "check_test_suites: tests missing from //:all_tests (add each to _FAST_TESTS or" >&2
  echo "_SLOW_TESTS in BUILD.bazel):" >&2
  echo "$missing" | sed 's/^/  /' >&2
  status=1
fi
if [[ -n "$extra" ]]; then
  echo "check_test_suites: in //:fast but not in //:all_tests:" >&2
  echo "$extra" | sed 's/^/  /' >&2
  status=1
fi
if ((status == 0)); then
  all="$(query 'tests(//:all_tests)')"
  fast="$(query 'tests(//:fast)')"
  echo "check_test_suites: $(wc -l <<<"$all") tests in //:all_tests, $(wc -l <<<"$fast") in //:fast"
fi
exit "$status"
