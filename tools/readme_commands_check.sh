#!/usr/bin/env bash
# The README's two commands and the ones CI runs must be the same: the lines of the code block
# under README.md's "## The two commands" (each without its # comment) against the arguments of
# .ci/run's `readme_command '...'` lines, in order. A test section of `make test` (and so of CI);
# prints "tests: N passed, M failed, 0 skipped" for tools/run_tests.sh.
#   tools/readme_commands_check.sh [README [CI_SCRIPT]]
set -u
cd "$(dirname "$0")/.."
readme=${1:-README.md} ci=${2:-.ci/run}

readme_commands() {
  awk '/^## The two commands/ { section = 1; next }
       section && /^```/ { if (inside) exit; inside = 1; next }
       inside { sub(/[ \t]*#.*$/, ""); if ($0 != "") print }' "$readme"
}
ci_commands() {
  sed -nE "s/^[^#]*readme_command '([^']*)'.*$/\1/p" "$ci"
}

want=$(readme_commands) got=$(ci_commands)
if [[ -n $want && $want == "$got" ]]; then
  echo "ok: $ci runs the README's commands: $(paste -sd ';' <<<"$want")"
  echo "tests: 1 passed, 0 failed, 0 skipped"
  exit 0
fi
echo "FAILED: $readme's \"The two commands\" and $ci's readme_command lines differ"
echo "  README:"; sed 's/^/    /' <<<"${want:-(none found)}"
echo "  CI:"; sed 's/^/    /' <<<"${got:-(none found)}"
echo "tests: 0 passed, 1 failed, 0 skipped"
exit 1
