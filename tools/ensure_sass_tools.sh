#!/usr/bin/env bash
# Makes sure cuobjdump and nvdisasm (for tools/sass_check.sh) are at hand: the toolkit's, or
# NVIDIA's PyPI wheels installed with `pip install --target` into a cache folder outside the
# repository (CUDA 13.0 toolkits here ship without them; the 13.2 wheels read its objects).
# Prints what it did on stderr and, last on stdout, the folder holding both binaries.
#   SASS_TOOLS_DIR  the cache folder (default ${XDG_CACHE_HOME:-$HOME/.cache}/yolo-sass-tools)
#   SASS_TOOLS_VERSION  the wheels' version (default 13.2.51)
#   PIP             the pip command (default: python3 -m pip)
set -euo pipefail
version=${SASS_TOOLS_VERSION:-13.2.51}
dir=${SASS_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/yolo-sass-tools}
bin=$dir/$version/nvidia/cu13/bin
cuda_bin=${CUDA_HOME:-/usr/local/cuda}/bin

usable() { [[ -x "$1/cuobjdump" && -x "$1/nvdisasm" ]] && "$1/cuobjdump" --version >/dev/null 2>&1; }

if usable "$cuda_bin"; then
  echo "sass tools: the toolkit's, in $cuda_bin" >&2
  echo "$cuda_bin"
  exit 0
fi
if usable "$bin"; then
  echo "sass tools: already installed in $bin" >&2
  echo "$bin"
  exit 0
fi
export PIP_ROOT_USER_ACTION=ignore  # root installs into our own folder: nothing to warn about
read -r -a pip <<<"${PIP:-python3 -m pip}"
echo "sass tools: installing nvidia-cuda-cuobjdump==$version and nvidia-cuda-nvdisasm==$version into $dir/$version" >&2
mkdir -p "$dir"
if ! "${pip[@]}" install --quiet --disable-pip-version-check --no-deps --target "$dir/$version" \
  "nvidia-cuda-cuobjdump==$version" "nvidia-cuda-nvdisasm==$version" >&2; then
  echo "error: pip could not install the wheels; set CUOBJDUMP= to a cuobjdump (with nvdisasm beside it or on PATH)" >&2
  exit 1
fi
if ! usable "$bin"; then
  echo "error: the wheels installed, but $bin holds no working cuobjdump and nvdisasm" >&2
  exit 1
fi
echo "sass tools: installed in $bin" >&2
echo "$bin"
