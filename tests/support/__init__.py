"""Test support shared by the tests and the benchmarks: the labelled corpus, loopback processes."""
