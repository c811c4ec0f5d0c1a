"""``eos bench``: this package's pipelines next to what users would otherwise pick.

The same keyed count (Kafka -> running count per key -> sink) runs in every
engine on the same broker, data and machine; the runner (``runner.py``) measures
throughput, latency, commit time, recovery time and peak memory, and
``report.py`` writes the markdown table and the chart.
"""
