#!/usr/bin/env bash
# Idempotent set-up: installs every system and Python dependency, then builds.
#   scripts/setup.sh            install + configure + build (CUDA auto-detected)
#   SKIP_BUILD=1 scripts/setup.sh   install only
# Re-running is safe: apt and pip skip what is already there; cmake reuses build/.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(build-essential cmake pkg-config git python3-pip
  libeigen3-dev libboost-dev libhdf5-dev hdf5-tools libcli11-dev libfmt-dev doctest-dev nlohmann-json3-dev libtomlplusplus-dev
  openmpi-bin libopenmpi-dev)  # MPI: the multi-process kl-sweep (docs/MPI_SWEEP.md), optional at build time

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
# The Python side: this checkout's replayssm_py package, editable, with the test and plot extras
# (pyproject.toml; tokenizers is a base dependency). Reinstalled when it is missing, lacks a
# dependency, or is installed from another checkout.
if ! "$PY" - >/dev/null 2>&1 <<'PYCHECK'
import pathlib
import h5netcdf, h5py, ipykernel, matplotlib, ml_dtypes, nbconvert, nbformat, numpy, pytest, safetensors, tokenizers, xarray  # noqa: F401
import replayssm_py
assert pathlib.Path(replayssm_py.__file__).resolve().parent == pathlib.Path("python/replayssm_py").resolve()
PYCHECK
then
  PIP_FLAGS=(-q)
  # Debian's own python3 is "externally managed" (PEP 668): its pip refuses to install without this.
  if "$PY" -c 'import pathlib, sys, sysconfig; sys.exit(not pathlib.Path(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED").exists())'; then
    PIP_FLAGS+=(--break-system-packages)
  fi
  echo "[setup] pip install -e '.[test,plot]'"
  "$PY" -m pip install "${PIP_FLAGS[@]}" -e '.[test,plot]'
else
  echo "[setup] python packages present"
fi

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  BUILD_DIR=${BUILD_DIR:-build}
  cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
  cmake --build "$BUILD_DIR" -j"$(nproc)"
fi
