#!/usr/bin/env bash
# Builds the GPU kit's bundle: everything a lent GPU machine (no Bazel, no
# network, no Debian packages; PyTorch 2.11.0+cu130 as `python3`) needs to run
# pipe's CUDA test cases, train_gpt, train_llama and the GPU bench, in one git-ignored
# folder that travels with a device call (64 MiB per call, the repository
# included). docs/gpus_and_libtorch.md "The GPU kit" says how to use it.
#
#   tools/gpu/bundle.sh [--out=gpu_bundle] [--no_build] [--only=//a:b,//c:d] [--pack]
#
# --pack also writes gpu_bundle_packed/gpu_bundle.tar.xz (git-ignored): the
# bundle compressed to about a third, for a device call whose repository
# plus bundle would pass the 64 MiB a call carries. The call then unpacks it
# first (docs/gpus_and_libtorch.md "Spending a lease").
#
# --only bundles just those of the labels below (a partial bundle, e.g. to try
# the plumbing while the rest still builds; run_on_device.sh then fails the
# stages whose binary is missing).
#
# 1. ./bazelw build --config=cuda the binaries of tools/gpu/cuda_tests.txt,
#    //experiments:train_gpt, //experiments:train_llama and //bench:gpu_pp1 (the CI's cuda build makes
#    these cache hits).
# 2. Copies them into <out>/bin (stripped), and into <out>/lib every shared
#    library they load that the GPU machine's image does not have: pipe's own
#    (Bazel's _solib_k8) and Debian's (Abseil, glog, gflags, protobuf, ...).
#    The image has: glibc, libstdc++ and libgcc_s, and PyTorch's
#    site-packages (torch/lib, nvidia/*/lib: LibTorch, CUDA, cuDNN, NCCL).
#    Which sonames site-packages holds is read from a pip install of the same
#    PyTorch (tools/python_env.sh torch-2.11, made once).
# 3. Rewrites every run path to $ORIGIN-relative ones (tools/gpu/elf_runpath.py),
#    so nothing points at this machine's folders.
# 4. Adds run_on_device.sh, the test list, experiments/configs, the PyTorch
#    reference script and a manifest; checks the size (<= 60 MiB).
# tools/gpu/check_bundle.sh then proves it self-contained (CI runs both).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=gpu_bundle
build=1
only=
pack=0
for arg in "$@"; do
  case "$arg" in
    --out=*) out=${arg#--out=} ;;
    --no_build) build=0 ;;
    --only=*) only=,${arg#--only=}, ;;
    --pack) pack=1 ;;
    *) echo "bundle.sh: unknown argument '$arg'; valid: --out=DIR, --no_build, --only=LABELS, --pack" >&2; exit 2 ;;
  esac
done
if [[ -n ${PP_LIBTORCH_DIR:-} ]]; then
  echo "bundle.sh: PP_LIBTORCH_DIR is set ($PP_LIBTORCH_DIR); the bundle must link the pinned" \
    "LibTorch 2.11.0+cu130 the GPU machines carry: unset it" >&2
  exit 2
fi
readonly max_bytes=$((60 * 1024 * 1024))
readonly pinned_torch="2.11.0+cu130"

mapfile -t test_labels < <(grep -v '^\s*\(#\|$\)' tools/gpu/cuda_tests.txt | awk '{print $1}')
labels=()
readonly binaries=(//experiments:train_gpt //experiments:train_llama //bench:gpu_pp1)
for label in "${test_labels[@]}" "${binaries[@]}"; do
  [[ -z $only || $only == *,$label,* ]] && labels+=("$label")
done
((${#labels[@]})) || { echo "bundle.sh: --only names none of: ${test_labels[*]} ${binaries[*]}" >&2; exit 2; }
if ((build)); then
  ./bazelw build --config=cuda "${labels[@]}"
fi
# PIPE_BAZEL_BIN: another output tree (bazel info waits for a running build).
bazel_bin=${PIPE_BAZEL_BIN:-$(./bazelw info --config=cuda bazel-bin 2>/dev/null)}
python=$(tools/python_env.sh torch-2.11)/bin/python3
site=$("$python" -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' 2>/dev/null)

# The sonames the GPU machine's image provides.
declare -A provided=()
for so in ld-linux-x86-64.so.2 linux-vdso.so.1 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 \
  librt.so.1 libutil.so.1 libresolv.so.2 libstdc++.so.6 libgcc_s.so.1; do
  provided[$so]=1
done
for f in "$site"/torch/lib/*.so* "$site"/nvidia/*/lib/*.so*; do
  provided[$(basename "$f")]=1
done

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/py" "$out/experiments"
declare -A copied=()
copy_libs() {  # the libraries $1 loads that the image lacks, into $out/lib
  local line name path
  while read -r line; do
    case "$line" in
      *"=> not found"*) echo "bundle.sh: $1 needs ${line%% *}, which is nowhere here" >&2; exit 1 ;;
      *" => "*) name=${line%% *}; path=${line#* => }; path=${path% (*} ;;
      *) continue ;;
    esac
    [[ -n ${provided[$name]:-} || -n ${copied[$name]:-} ]] && continue
    cp -L "$path" "$out/lib/$name"
    chmod u+w "$out/lib/$name"
    copied[$name]=1
  done < <(ldd "$1")
}
for label in "${labels[@]}"; do
  path=${label#//}
  path=${path/://}
  name=$(basename "$path")
  [[ -x "$bazel_bin/$path" ]] || { echo "bundle.sh: $bazel_bin/$path was not built" >&2; exit 1; }
  cp -L "$bazel_bin/$path" "$out/bin/$name"
  chmod u+w "$out/bin/$name"
  copy_libs "$bazel_bin/$path"
done
strip --strip-unneeded "$out"/bin/* "$out"/lib/*
for f in "$out"/bin/*; do python3 tools/gpu/elf_runpath.py "$f" '$ORIGIN/../lib'; done
for f in "$out"/lib/*; do python3 tools/gpu/elf_runpath.py "$f" '$ORIGIN'; done

cp tools/gpu/run_on_device.sh "$out/"
# The test list, less the binaries a partial bundle (--only) left out.
while read -r label rest; do
  [[ $label == //* && ! -x $out/bin/${label##*:} ]] && continue
  echo "$label${rest:+ $rest}"
done < tools/gpu/cuda_tests.txt > "$out/cuda_tests.txt"
cp tools/gpu/kit_summary.py bench/torch_gpt_reference.py bench/torch_llama_reference.py \
  bench/peer_gpt.py "$out/py/"
# Tests run in the bundle root as in a runfiles root: experiment_config_test
# reads experiments/configs/ and driver/testdata/ (its data dependencies);
# train_gpt uses a config too. Every bundled test's package testdata/ goes
# along (small: text protos, fuzz corpora).
cp -r experiments/configs "$out/experiments/"
for label in "${labels[@]}"; do
  package=${label#//}
  package=${package%%:*}
  if [[ -d $package/testdata && ! -d $out/$package/testdata ]]; then
    mkdir -p "$out/$package"
    cp -r "$package/testdata" "$out/$package/"
  fi
done
echo "$pinned_torch" > "$out/PINNED_TORCH"
commit=$(git rev-parse HEAD)
git diff --quiet HEAD -- . ':!gpu_bundle' 2>/dev/null || commit="$commit+uncommitted"
bytes=$(du -sb "$out" | cut -f1)
cat > "$out/MANIFEST.json" <<JSON
{"commit": "$commit", "built_utc": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "torch": "$pinned_torch",
 "build": "./bazelw build --config=cuda", "bytes": $bytes,
 "binaries": [$(ls "$out/bin" | sed 's/.*/"&"/' | paste -sd, -)],
 "libraries": [$(ls "$out/lib" | sed 's/.*/"&"/' | paste -sd, -)]}
JSON
# What travels is the bundle, or with --pack its xz archive (unpacked on the
# device first): that must fit beside the repository.
if ((bytes > max_bytes && !pack)); then
  echo "bundle.sh: $out is $bytes bytes, over the $max_bytes the device call can carry beside the" \
    "repository; --pack writes it as an xz archive (about a third) that a call unpacks" >&2
  exit 1
fi
echo "bundle.sh: $out: $(ls "$out/bin" | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries, $((bytes / 1024 / 1024)) MiB ($bytes bytes), commit $commit" >&2
if ((pack)); then
  mkdir -p gpu_bundle_packed
  tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T0 -6 > gpu_bundle_packed/gpu_bundle.tar.xz
  packed=$(du -b gpu_bundle_packed/gpu_bundle.tar.xz | cut -f1)
  echo "bundle.sh: gpu_bundle_packed/gpu_bundle.tar.xz: $packed bytes" >&2
  if ((packed > max_bytes)); then
    echo "bundle.sh: gpu_bundle_packed/gpu_bundle.tar.xz is $packed bytes, over the $max_bytes the" \
      "device call can carry beside the repository" >&2
    exit 1
  fi
fi
