#!/usr/bin/env bash
# Fails if a tracked C++ file differs from what clang-format makes of it
# (.clang-format: Google style, 100 columns). Fix with:
#   git ls-files '*.cc' '*.h' | xargs clang-format -i
# Usage: tools/check_format.sh [clang-format binary]
set -euo pipefail
cd "$(dirname "$0")/.."
clang_format="${1:-clang-format}"
command -v "$clang_format" >/dev/null || {
  echo "check_format: '$clang_format' not found; install Debian's clang-format" >&2
  exit 2
}
mapfile -t files < <(git ls-files '*.cc' '*.h')
if ((${#files[@]} == 0)); then
  echo "check_format: no tracked .cc/.h files; run inside pipe's git checkout" >&2
  exit 2
fi
if ! "$clang_format" --dry-run -Werror "${files[@]}"; then
  echo "check_format: the files above are not clang-format clean; run" >&2
  echo "  git ls-files '*.cc' '*.h' | xargs $clang_format -i" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files clean ($("$clang_format" --version | head -n1))"
