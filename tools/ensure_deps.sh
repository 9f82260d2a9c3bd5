#!/usr/bin/env bash
# Makes sure the Debian packages the build needs are present: installs them when running as
# root (or with passwordless sudo), otherwise stops with the one command that installs them.
# Header locations can be overridden (STB_INC=, DOCTEST_INC=) on machines where nothing can
# be installed; then a missing header is an error naming the override.
set -euo pipefail
STB_INC=${STB_INC:-/usr/include/stb}
DOCTEST_INC=${DOCTEST_INC:-/usr/include}

missing=()
declare -A origin
check() {  # header path, package, override variable, default
  if [[ ! -f "$1" ]]; then
    if [[ "$4" != "$5" ]]; then
      echo "error: $1 not found (from $3=$4); point $3 at the folder holding it" >&2
      exit 1
    fi
    missing+=("$2")
    origin[$2]=$1
  fi
}
check "$STB_INC/stb_image.h" libstb-dev STB_INC "$STB_INC" /usr/include/stb
check "$DOCTEST_INC/doctest/doctest.h" doctest-dev DOCTEST_INC "$DOCTEST_INC" /usr/include
[[ ${#missing[@]} -eq 0 ]] && exit 0

cmd="apt-get install -y --no-install-recommends ${missing[*]}"
if [[ $(id -u) -eq 0 ]]; then sudo=""
elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo"
else
  echo "error: missing ${missing[*]} (${origin[*]}). Install them with:" >&2
  echo "  sudo apt-get update && sudo $cmd" >&2
  exit 1
fi
echo "installing missing packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
if ! $sudo $cmd >/dev/null 2>&1; then
  $sudo apt-get update -qq >/dev/null
  $sudo $cmd >/dev/null
fi
