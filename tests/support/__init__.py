"""Test-support code shared by tests and benchmarks (importable as `support` with tests/ on sys.path)."""
