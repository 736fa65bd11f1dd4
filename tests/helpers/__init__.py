"""Test scaffolding shared by tests and benchmarks (never shipped in the package)."""
