"""The runtime core: what runs inside a user's Spark job (the driver and its tasks).

The two-phase commit protocol (:mod:`.protocol`), a task's identity (:mod:`.context`),
option parsing (:mod:`.options`), credentials (:mod:`.secrets`), fault points
(:mod:`.faults`), start checks (:mod:`.startup`), and the small helpers the
connectors share. Nothing here imports the operator tools (``ops``), the command
line (``cli``) or the development tooling (``dev``).
"""
