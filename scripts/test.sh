#!/usr/bin/env bash
# The whole test suite on a fresh machine: setup, lint, tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/python -m pytest "$@"
