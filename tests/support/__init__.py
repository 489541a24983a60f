"""Test support shared by the tests, the benchmarks and the preview script: the labelled corpus, loopback processes
(`loopback`), the monitoring stack (`stack`), the boards on a real Prometheus with Grafana's transformations
(`boards`)."""
