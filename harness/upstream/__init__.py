"""Upstream's helpers mirrored on public APIs, for test files that import them (from
common_utils and common_distributed): debug levels and captured output (dist_utils.py),
ports, stores and connection retries (network.py), gradient checks (grad_checks.py) and
the remaining test helpers (test_helpers.py)."""
