#!/usr/bin/env bash
# The self-containment check must pass on the bundle and fail, naming the
# library, when one is missing or when a run path names a build-machine
# folder. .ci/run runs it after tools/gpu/bundle.sh (docs/gpus_and_libtorch.md "The GPU kit").
#
#   tools/gpu/check_bundle_test.sh [BUNDLE_DIR=gpu_bundle]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=$(cd "${1:-gpu_bundle}" && pwd)
export PYTHON=${PYTHON:-$("$here/../python_env.sh" torch-2.11)/bin/python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$here/check_bundle.sh" "$bundle" || fail "the bundle itself does not pass"

# A Debian library (glog) and one of pipe's own removed: the check must fail
# and name it, for every binary that needs it.
for pattern in 'libglog.so.*' 'libcommon_Slibtorch_Ucompat.so'; do
  cp -a "$bundle" "$tmp/b"
  victim=$(cd "$tmp/b/lib" && ls $pattern 2>/dev/null | head -n1)
  [[ -n $victim ]] || fail "no library matching $pattern in the bundle to remove"
  rm "$tmp/b/lib/$victim"
  set +e
  "$here/check_bundle.sh" "$tmp/b" > "$tmp/out" 2>&1
  rc=$?
  set -e
  ((rc == 1)) || { cat "$tmp/out"; fail "check passed (rc $rc) with $victim removed"; }
  # Not found, or found only in this machine's system folders (Debian has
  # glog; the GPU machine does not): either way the check names it.
  # grep -c prints 0 and exits 1 when nothing matches; the next line fails then.
  named=$(grep -cE "$victim (is not found|resolves to /)" "$tmp/out") || named=0
  ((named > 0)) || { cat "$tmp/out"; fail "the failure does not name $victim"; }
  echo "ok: removing $victim fails the check ($named binary(ies) named)"
  rm -rf "$tmp/b"
done

# A run path that names a folder of this machine.
cp -a "$bundle" "$tmp/b"
victim=$(ls "$tmp/b/bin" | head -n1)
python3 "$here/elf_runpath.py" "$tmp/b/bin/$victim" '/usr/lib' || fail "could not set a run path"
set +e
"$here/check_bundle.sh" "$tmp/b" > "$tmp/out" 2>&1
rc=$?
set -e
((rc == 1)) && grep -q "run path entry '/usr/lib'" "$tmp/out" ||
  { cat "$tmp/out"; fail "a /usr/lib run path in bin/$victim was not refused"; }
echo "ok: a run path naming /usr/lib fails the check"
echo "PASS: check_bundle_test"
