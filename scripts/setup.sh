#!/usr/bin/env bash
# Prepares a machine for the test suite: the Debian packages the end-to-end tests use (prometheus + promtool,
# alertmanager + amtool, openssl, chromium) and a virtual environment with the exporter and its `test` and
# `trl-test` extras (TRL on CPU, for the callback's tests). `scripts/setup.sh --bench` adds mtail, the ingest
# benchmark's baseline. Running the exporter needs none of this: `pip install .` into a venv is enough.
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
# The `trl-test` extra's torch first, pinned: pip takes the CPU wheel this machine keeps on disk (a plain `torch` would
# download several GB of CUDA libraries); then the exporter with its test and trl extras.
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -e '.[test,trl-test]'
# pip compiles the bytecode of a package it installs (the image does that), not of an editable
# install; with PYTHONDONTWRITEBYTECODE set, every start would compile the package again.
.venv/bin/python -m compileall -q exporter
