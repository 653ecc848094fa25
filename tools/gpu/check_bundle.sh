#!/usr/bin/env bash
# Proves a GPU bundle self-contained: with LD_LIBRARY_PATH exactly as the
# bundle's run_on_device.sh sets it (its --print_library_path, using PYTHON's
# PyTorch as the device's), `ldd` resolves every library of every binary and
# library in the bundle either inside the bundle or inside PyTorch's
# site-packages (torch/lib, nvidia/*/lib), except the base system libraries
# every machine that runs PyTorch has (glibc, libstdc++, libgcc_s). Also
# refuses a run path that is not $ORIGIN-relative (it would name a folder of
# the build machine).
#
#   PYTHON=$(tools/python_env.sh torch-2.11)/bin/python3 tools/gpu/check_bundle.sh gpu_bundle
#
# Prints one line per problem and exits 1, or a one-line count and exits 0.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bundle=${1:?usage: check_bundle.sh BUNDLE_DIR (PYTHON names the python3 with PyTorch)}
bundle=$(cd "$bundle" && pwd)
python=${PYTHON:-python3}
library_path=$(PYTHON=$python "$bundle/run_on_device.sh" --print_library_path) ||
  { echo "check_bundle: $bundle/run_on_device.sh --print_library_path failed" >&2; exit 1; }
# The script's path is <bundle>/lib:<site-packages>/torch/lib:<nvidia libs>.
site=$(cut -d: -f2 <<< "$library_path")
site=${site%/torch/lib}
base_system=" ld-linux-x86-64.so.2 linux-vdso.so.1 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 librt.so.1 libutil.so.1 libresolv.so.2 libstdc++.so.6 libgcc_s.so.1 "
problems=0
files=0
problem() { echo "check_bundle: $*"; problems=$((problems + 1)); }
# Run paths of every file, in one pass.
while IFS=$'\t' read -r f rp; do
  files=$((files + 1))
  IFS=: read -ra entries <<< "$rp"
  for e in "${entries[@]}"; do
    [[ $e == '$ORIGIN'* ]] || problem "$f: run path entry '$e' is not \$ORIGIN-relative"
  done
done < <(python3 "$here/elf_runpath.py" --list "$bundle"/bin/* "$bundle"/lib/* ||
  echo "$bundle	(unreadable ELF file above)")
# ldd of a binary lists its whole closure, so the binaries cover every
# library the bundle's programs load; a library no binary loads is reported.
declare -A loaded=()
for f in "$bundle"/bin/*; do
  # ldd's status is not used: its output names what is missing either way.
  out=$(env -i PATH="$PATH" LD_LIBRARY_PATH="$library_path" ldd "$f" 2>&1) || true
  while read -r line; do
    case "$line" in
      *"=> not found"*) problem "$f: ${line%% *} is not found (neither in the bundle nor in $site)"; continue ;;
      *" => "*) name=${line%% *}; path=${line#* => }; path=${path% (*} ;;
      *) continue ;;
    esac
    real=$(readlink -f "$path")
    case "$real" in
      "$bundle"/lib/*) loaded[$(basename "$real")]=1 ;;
      "$site"/torch/lib/* | "$site"/nvidia/*/lib/*) ;;
      *)
        [[ $base_system == *" $name "* ]] ||
          problem "$f: $name resolves to $path, outside the bundle and $site/{torch,nvidia/*}/lib"
        ;;
    esac
  done <<< "$out"
done
for f in "$bundle"/lib/*; do
  [[ -n ${loaded[$(basename "$f")]:-} ]] || problem "$f: no binary of the bundle loads it"
done
((files > 0)) || problem "$bundle has no binaries or libraries"
if ((problems)); then
  echo "check_bundle: $problems problem(s) in $bundle"
  exit 1
fi
echo "check_bundle: $bundle is self-contained: $files files, every library in the bundle, $site or the base system"
