# Shared helpers of the train_* end-to-end tests (sourced; needs $TMP, and
# runs under $TMP/runs as the tests' --output_dir).
#   losses NAME        "step loss" lines of run NAME's metrics.jsonl, by step
#   close_losses WANT GOT WHAT [RTOL]
#                      the same steps, each loss within RTOL relative
#                      (default 1e-5); prints the largest difference

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
