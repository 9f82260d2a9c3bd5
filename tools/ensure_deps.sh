#!/usr/bin/env bash
# Makes sure the Debian packages the build needs are present: installs them when running as
# root (or with passwordless sudo), otherwise stops with the one command that installs them.
# Header locations can be overridden (STB_INC=, DOCTEST_INC=) on machines where nothing can
# be installed; then a missing header is an error naming the override.
# FUZZ=0 (what `make` alone passes): clang and libFuzzer are not wanted, so not looked for.
set -euo pipefail
STB_INC=${STB_INC:-/usr/include/stb}
DOCTEST_INC=${DOCTEST_INC:-/usr/include}
FUZZ=${FUZZ:-1}

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
# clang (with libFuzzer's runtime) builds the fuzz targets (tests/fuzz/fuzz.mk). Optional: where
# nothing can be installed they are skipped, and the rest of the build goes on.
can_install() { command -v apt-get >/dev/null && { [[ $(id -u) -eq 0 ]] || { command -v sudo >/dev/null && sudo -n true 2>/dev/null; }; }; }
clangxx=$(command -v clang++-14 || command -v clang++ || true)
if [[ $FUZZ != 0 && -z $clangxx ]]; then
  if can_install; then
    missing+=(clang libclang-rt-14-dev)
    origin[clang]=clang++
  else
    echo "note: clang++ not found: the fuzz targets are skipped (apt-get install clang libclang-rt-14-dev)" >&2
  fi
elif [[ $FUZZ != 0 && ! -f $("$clangxx" -print-file-name=libclang_rt.fuzzer-x86_64.a) &&
        ! -f $("$clangxx" -print-resource-dir)/lib/linux/libclang_rt.fuzzer-x86_64.a ]]; then
  version=$("$clangxx" -dumpversion | cut -d. -f1)
  if can_install; then
    missing+=("libclang-rt-$version-dev")
    origin[libclang-rt-$version-dev]="libFuzzer for $clangxx"
  else
    echo "note: $clangxx has no libFuzzer runtime: the fuzz targets will not link (apt-get install libclang-rt-$version-dev)" >&2
  fi
fi
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
