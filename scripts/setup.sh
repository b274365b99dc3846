#!/usr/bin/env bash
# Idempotent set-up: installs every system and Python dependency, then builds.
#   scripts/setup.sh            install + configure + build (CUDA auto-detected)
#   SKIP_BUILD=1 scripts/setup.sh   install only
# Re-running is safe: apt and pip skip what is already there; cmake reuses build/.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake pkg-config git
  libeigen3-dev libboost-dev libhdf5-dev libcli11-dev libfmt-dev doctest-dev nlohmann-json3-dev libtomlplusplus-dev)
PIP_PACKAGES=(numpy h5py matplotlib ml_dtypes jupyter nbconvert nbformat ipykernel pytest)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
  echo "[setup] system packages present"
fi

PY=${PYTHON:-python3}
if ! "$PY" -c "import numpy, h5py, matplotlib, ml_dtypes, nbconvert, nbformat, pytest" >/dev/null 2>&1; then
  echo "[setup] pip install ${PIP_PACKAGES[*]}"
  "$PY" -m pip install -q "${PIP_PACKAGES[@]}"
else
  echo "[setup] python packages present"
fi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  BUILD_DIR=${BUILD_DIR:-build}
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
  cmake --build "$BUILD_DIR" -j"$(nproc)"
fi
