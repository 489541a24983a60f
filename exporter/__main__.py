from exporter.cli import entry

raise SystemExit(entry())
