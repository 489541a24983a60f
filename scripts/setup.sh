#!/usr/bin/env bash
# Prepares a machine for the test suite: the Debian packages the end-to-end tests use (prometheus + promtool,
# alertmanager + amtool, openssl, chromium) and a virtual environment with the exporter and its `test` and
# `trl-test` extras (TRL on CPU, for the callback's tests). `scripts/setup.sh --bench` adds mtail, the ingest and
# footprint benchmarks' baseline. Running the exporter needs none of this: `pip install .` into a venv is enough.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v promtool >/dev/null || missing+=(prometheus)
command -v prometheus-alertmanager >/dev/null || missing+=(prometheus-alertmanager)
if [ "${1:-}" = "--bench" ]; then
  command -v mtail >/dev/null || missing+=(mtail)
fi
command -v openssl >/dev/null || missing+=(openssl)  # tests/test_web.py makes its TLS certificates with it
command -v chromium >/dev/null || missing+=(chromium)  # the report's HTML page, tested in a real browser
# tests/test_image.py: the sidecar image built without a daemon or a registry (scripts/image/build.sh)
command -v buildah >/dev/null || missing+=(buildah)
command -v mmdebstrap >/dev/null || missing+=(mmdebstrap)
command -v strip >/dev/null || missing+=(binutils)  # build.sh strips the wheels' debugging information
command -v shellcheck >/dev/null || missing+=(shellcheck)  # actionlint checks the workflows' shell steps with it
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: need Debian packages ${missing[*]}: run as root or 'sudo apt-get install ${missing[*]}'" >&2
    exit 1
  fi
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
# The `trl-test` extra's torch first, pinned, as the CPU build: PyPI's torch wheel for Linux pulls several GB of CUDA
# libraries, PyTorch's CPU index has the same version without them (2.13.0+cpu, which pip prefers). A machine that
# keeps that wheel on disk (pip's find-links) takes it from there and asks no other index.
torch_index=(--extra-index-url "${TORCH_INDEX:-https://download.pytorch.org/whl/cpu}")
if .venv/bin/python -m pip download -q --no-deps --no-index -d "$(mktemp -d)" torch==2.13.0 >/dev/null 2>&1; then
  torch_index=()
fi
.venv/bin/python -m pip install -q "${torch_index[@]}" torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test,trl-test]'
# pip compiles the bytecode of a package it installs (the image does that), not of an editable
# install; with PYTHONDONTWRITEBYTECODE set, every start would compile the package again.
.venv/bin/python -m compileall -q exporter
