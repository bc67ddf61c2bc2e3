# Sourced by scripts/demo and scripts/test: installs what weft needs from Debian's packages when run
# as root, or prints the exact apt-get line and exits non-zero otherwise; puts nvcc on PATH when
# the CUDA toolkit is installed in its usual place.
set -euo pipefail

WEFT_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WEFT_PACKAGES=(cmake make g++ libeigen3-dev doctest-dev libcli11-dev nlohmann-json3-dev libxxhash-dev
  openmpi-bin libopenmpi-dev libopenblas-pthread-dev)

weft_missing_packages() {
  local missing=()
  for p in "${WEFT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  echo "${missing[@]:-}"
}

weft_setup() {
  local missing
  missing=$(weft_missing_packages)
  if [ -n "$missing" ]; then
    if [ "$(id -u)" -eq 0 ]; then
      echo "weft: installing $missing"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -qq
      # shellcheck disable=SC2086
      apt-get install -y -qq --no-install-recommends $missing >/dev/null
    else
      echo "weft: missing packages: $missing" >&2
      echo "weft: run: sudo apt-get install -y $missing" >&2
      exit 1
    fi
  fi
  if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
    export PATH="/usr/local/cuda/bin:$PATH"
  fi
  WEFT_JOBS=$(nproc)
  export WEFT_JOBS
}
