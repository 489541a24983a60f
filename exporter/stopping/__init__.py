"""Stopping the trainer by signals (config `early_stop.action: signal`): when the stop signal is raised
(exporter/stopsignal.py: a finding of `early_stop.severity` for the run's own, unfinished training), the trainer is
sent `early_stop.signal` (SIGINT by default), SIGTERM after `early_stop.grace_seconds` if it is still running, and
SIGKILL after `early_stop.kill_after_seconds` more. Under `run` the trainer is the child's process group
(targets.ChildGroup); beside it (`serve`, a pod with a shared process namespace) the processes found by their
command line or PID (targets.MatchedProcesses). docs/early-stop.md says what each framework does with the signals."""
