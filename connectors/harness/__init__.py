"""The exactly-once harness: pipelines run as their own processes, crashed and checked."""
