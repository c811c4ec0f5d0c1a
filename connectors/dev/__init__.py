"""Development tooling: the local service stack, the exactly-once harness and the
benchmarks. Tooling depends on the runtime; the runtime never imports this package.
"""
