"""One module per command (serve, run, dump, report, demo); exporter/cli.py parses the flags and calls one.

serving.py is what serve, run and demo share: the HTTP side, the reading thread, signals and retried set-up."""
