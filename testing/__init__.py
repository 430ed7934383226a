"""Test harnesses shared by tests/ and benchmarks/: hostile peers, tampered artifacts, mutated models,
resource bombs, conformance cases. Never imported by the product packages."""
