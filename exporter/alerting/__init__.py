"""The Prometheus rules that turn the exporter's judgments into pages and warnings (generated, not written)."""
