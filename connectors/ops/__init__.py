"""Operator tools as a library: read a checkpoint, take and restore savepoints, rescale
state, read state (``eos checkpoint``, ``eos savepoint``, ``eos state`` are thin
commands over these), and a SparkSession set up for the package.

Driver-side only. Depends on the runtime core and the connectors, never on the
development tooling.
"""
