# tests/cli/common.sh: what the CLI test scripts share (sourced): a scratch folder removed on exit,
# pass/fail counters, check (exit code + one stderr line), and the fixture's ids and prefill length
# from its reference.json.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0

ids_of() { python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$1/reference.json"; }
prefill_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['prefill'])" "$1/reference.json"; }

check() {  # check NAME EXPECTED_CODES GREP_PATTERN -- command...
  local name="$1" codes="$2" pattern="$3"
  shift 4
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(wc -l <"$tmp/err")
  if [[ " $codes " != *" $rc "* ]]; then
    echo "FAIL $name: exit code $rc, expected one of [$codes]"; cat "$tmp/err"; failures=$((failures + 1)); return
  fi
  if [ "$rc" -ne 0 ] && [ "$lines" -ne 1 ]; then
    echo "FAIL $name: expected one line on stderr, got $lines:"; cat "$tmp/err"; failures=$((failures + 1)); return
  fi
  if [ -n "$pattern" ] && ! grep -q -- "$pattern" "$tmp/err"; then
    echo "FAIL $name: stderr lacks '$pattern':"; cat "$tmp/err"; failures=$((failures + 1)); return
  fi
  echo "ok   $name"
  passes=$((passes + 1))
}
