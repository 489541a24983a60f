#!/bin/sh
# The README's picture of the HTML report (docs/img/report.png): the report of a real diverging run, drawn by
# headless chromium at 1200x1800. Run from the repository root after the report's look changed.
set -eu
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
python -m exporter report --output.format html --run grpo_kl_blowup_2 \
    tests/fixtures/corpus/grpo_kl_blowup_2/combined.log > "$out/report.html"
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1200,1800 \
    --screenshot="$out/report.png" "file://$out/report.html" 2>/dev/null
cp "$out/report.png" docs/img/report.png
