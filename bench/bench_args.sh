# shellcheck shell=bash disable=SC2034  # RECORD: read by the sourcing script
# Sourced by the bench/*.sh drivers that run train_gpt / train_llama themselves
# (tensor_parallel, tensor_parallel_peer, distributed_optimizer,
# distributed_optimizer_peer, vocab_parallel, packing): strict mode, the
# repository root as the working directory, their option parsing, the build,
# a scratch folder and a run whose log is shown when it fails.
#
#   source "$(dirname "$0")/bench_args.sh"
#   STEPS=30 WIDTH=256                    # the script's defaults
#   bench_parse_args "steps width record" "$@"
#   bench_build //experiments:train_gpt
#   bench_tmp
#   bench_run NAME "$BIN" --flags...      # output in $TMP/NAME.log
set -euo pipefail
cd "$(dirname "$0")/.."
RECORD=0
ASYNC=0

# bench_parse_args "ACCEPTED" ARGS...: ACCEPTED lists the options the script
# takes, of reps, steps, width, only (each with a value: --reps N sets REPS,
# --only REGEX sets ONLY) and record (--record sets RECORD=1) and async
# (--async sets ASYNC=1: runs with asynchronous vocabulary collectives
# added). Anything else is refused, exit 2, naming what is accepted.
bench_parse_args() {
  local accepted=$1 usage="" name
  shift
  for name in $accepted; do
    case $name in
      reps | steps) usage+=", --$name N" ;;
      width) usage+=", --width W" ;;
      only) usage+=", --only REGEX" ;;
      record) usage+=", --record" ;;
      async) usage+=", --async" ;;
      *) echo "bench_parse_args: unknown option name '$name'" >&2; exit 2 ;;
    esac
  done
  usage=${usage#, }
  while [[ $# -gt 0 ]]; do
    name=${1#--}
    if [[ $1 != --* || " $accepted " != *" $name "* ]]; then
      echo "unknown argument $1 ($usage)" >&2
      exit 2
    fi
    if [[ $name == record ]]; then
      RECORD=1
      shift
    elif [[ $name == async ]]; then
      ASYNC=1
      shift
    else
      printf -v "${name^^}" '%s' "$2"
      shift 2
    fi
  done
}

# bench_build TARGET...: builds them quietly.
bench_build() {
  ./bazelw build "$@" >/dev/null 2>&1
}

# bench_tmp: TMP, a scratch folder removed when the script exits.
bench_tmp() {
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
}

# bench_run NAME COMMAND...: runs COMMAND with its output in $TMP/NAME.log;
# on failure prints the log's last 30 lines and exits 1.
bench_run() {
  local name=$1
  shift
  "$@" >"$TMP/$name.log" 2>&1 || {
    tail -30 "$TMP/$name.log"
    exit 1
  }
}
