#!/usr/bin/env bash
# scripts/setup.sh — installs what stitch needs to build and test on Debian/Ubuntu, if missing.
# The CUDA toolkit is optional (it is used when found); nothing else is downloaded.
set -euo pipefail

packages=(cmake g++ make libgtest-dev libgmock-dev libbenchmark-dev libfmt-dev python3 python3-pytest python3-venv ninja-build)
# The sanitizer and fuzz smoke run (scripts/sanitize-smoke.sh) builds with clang and needs its
# runtimes (ASan, UBSan, TSan, libFuzzer).
[ "${STITCH_SKIP_SANITIZERS:-0}" = 1 ] || packages+=(clang libclang-rt-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi
# A headless browser for the test that opens stitch-replay's HTML report (replay_html_report_renders):
# Debian's chromium, where it can be installed; without it that test reports itself skipped.
if [ "${STITCH_SKIP_BROWSER:-0}" != 1 ] && ! command -v chromium >/dev/null 2>&1 &&
   ! command -v chromium-browser >/dev/null 2>&1; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  if [ -z "$sudo_cmd" ] || command -v sudo >/dev/null 2>&1; then
    echo "setup: installing chromium (for the HTML report test)"
    { $sudo_cmd apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq chromium >/dev/null; } ||
      echo "setup: chromium could not be installed: the HTML report test will be skipped" >&2
  else
    echo "setup: no chromium and no sudo: the HTML report test will be skipped" >&2
  fi
fi
cmake_version=$(cmake --version | head -1 | awk '{print $3}')
if ! printf '3.25\n%s\n' "$cmake_version" | sort -V -C; then
  echo "setup: cmake >= 3.25 is required (found $cmake_version)" >&2
  exit 1
fi
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "setup: CUDA toolkit found: the CUDA back end will be built"
else
  echo "setup: no CUDA toolkit: building the simulated device only"
fi
