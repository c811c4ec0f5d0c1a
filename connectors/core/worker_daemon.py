"""The worker daemon's old name, kept for sessions that set it.

``spark.python.daemon.module=eos_connectors.core.worker_daemon`` worked before the
daemon moved up beside the registry (:mod:`eos_connectors.worker_daemon`): it names
every connector's task modules, which the ground floor must not. Spark runs the
daemon module as a script (``python -m``); this one runs the new module by name
(:func:`runpy.run_module`), so nothing here imports above ``core`` and the layer
contract (``make lint``) holds without an exception. Set the new name: this one goes
in 1.0.
"""

from __future__ import annotations

import runpy

DAEMON = "eos_connectors.worker_daemon"

if __name__ == "__main__":
    runpy.run_module(DAEMON, run_name="__main__", alter_sys=True)
