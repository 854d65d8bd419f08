# tests/cli/common.sh: what the CLI test scripts share (sourced): a scratch folder removed on exit,
# pass/fail counters, and the fixture's ids and prefill length from its reference.json.
set -u
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passes=0

ids_of() { python3 -c "import json,sys; print(','.join(map(str, json.load(open(sys.argv[1]))['ids'])))" "$1/reference.json"; }
prefill_of() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['prefill'])" "$1/reference.json"; }
