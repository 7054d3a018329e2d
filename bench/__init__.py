"""The benchmark: throughput, latency, CPU and memory of the worker against a ceiling and a
partition-ordered baseline, plus the smaller tools beside it (``stack_cost``, ``webhooks``,
``kafka_floor``, ``produce_cost``, ``broker_history``, ``replica_lag``, ``memory``,
``decision``, ``api_load``). A repo-level tool, never installed: ``python -m bench``
(``make bench``); ``bench/README.md`` is their reference page (how to run each, what its
figures mean, the latest results).
"""
