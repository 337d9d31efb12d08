#!/usr/bin/env bash
# The base-install lane: `pip install .` without extras in a fresh virtualenv (no torch, vLLM,
# transformers or click), then the commands that need no engine, on a small fixture: --help,
# --version, import generic, summary, diagnose, check. Any failure fails the lane.
#   usage: scripts/base_install.sh [VENV_DIR]      (default: .venv-base; python3 from PATH or $PYTHON)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
venv=${1:-.venv-base}
python=${PYTHON:-python3}
fixture="$root/tests/data/io/generic/verl/rlparity_dump/step_5.npz"
t0=$(date +%s)

fail() { echo "base-install lane: FAIL: $*" >&2; exit 1; }
rm -rf "$venv"
"$python" -m venv "$venv"
venv=$(cd "$venv" && pwd)
log="$venv/install.log"
{ "$venv/bin/python" -m pip install --upgrade pip &&
  "$venv/bin/python" -m pip install "$root"; } >"$log" 2>&1 ||   # no extras, not editable: `pip install rlparity`
  { tail -30 "$log" >&2; fail "pip install . failed (log: $log)"; }
rl="$venv/bin/rlparity"
"$venv/bin/python" - <<'PY' || fail "the base install holds an engine or trainer package"
import importlib.util
held = [m for m in ("torch", "vllm", "transformers", "click") if importlib.util.find_spec(m)]
assert not held, f"the base install must not need these, but they are installed: {held}"
PY

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"   # outside the source tree: the installed package is what runs
touch runs   # `runs` as a file: no command without an engine may create runs/logs
tmp_before=$(ls "${TMPDIR:-/tmp}" | grep -c '^rlparity-vllm-logging-' || true)

expect() {  # expect CODES TEXT -- ARGS: run `rlparity ARGS`, exit code in CODES, TEXT in its output
    local codes=$1 text=$2; shift 3
    local out code=0
    out=$("$rl" "$@" 2>&1) || code=$?
    echo "+ rlparity $* -> exit $code"
    [[ " $codes " == *" $code "* ]] || { echo "$out" | tail -20 >&2; fail "rlparity $* exited $code, expected one of: $codes"; }
    [[ "$out" == *"$text"* ]] || { echo "$out" | tail -20 >&2; fail "rlparity $*: output lacks '$text'"; }
    ! grep -q "Traceback" <<<"$out" || fail "rlparity $* printed a traceback"
}
expect "0" "Usage" -- --help
expect "0" "rlparity " -- --version
expect "0" "imported generic" -- import generic "$fixture" -o run.zarr --no-progress
expect "0" "parity summary" -- summary run.zarr
expect "0" "\"mean_ratio\"" -- summary run.zarr --json
expect "0 1" "rlparity diagnose" -- diagnose run.zarr
expect "0 1" "\"passed\"" -- check run.zarr --json
expect "0 1" "rlparity check: " -- check run.zarr
expect "2" "no trace at" -- summary missing.zarr
[ -f runs ] || fail "a command replaced the file 'runs'"
tmp_after=$(ls "${TMPDIR:-/tmp}" | grep -c '^rlparity-vllm-logging-' || true)
[ "$tmp_after" -le "$tmp_before" ] || fail "a command left an rlparity-vllm-logging-*.json in the temp folder"
echo "base-install lane: ok in $(( $(date +%s) - t0 )) s"
