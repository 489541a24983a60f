"""What this build is and where its project lives: the one place that names the version, the source revision and
the project's home. pyproject.toml reads the version from here; Chart.yaml, the image's labels and the runbook links
are checked against it (tests/test_release.py). A release writes all of them from its tag (scripts/set_version.py)."""

VERSION = "0.1.0"
REVISION = ""  # the commit a release was built from; empty in a working tree (build_info says "unknown")
HOME = "https://github.com/posttrain-exporter/posttrain-exporter"
# The documentation shipped with this version: a tag's docs, so that a link never points at a newer text.
DOCS = f"{HOME}/blob/v{VERSION}/docs"
