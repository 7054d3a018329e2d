"""The benchmark: throughput, latency, CPU and memory of the worker against a ceiling and a
partition-ordered baseline, plus the smaller probes beside it (``api_load``, ``decision``,
``timer_sweep``, ``produce_cost``, ``kafka_floor``, ``broker_history``). A repo-level tool,
never installed: ``python -m bench`` (``make bench``); ``bench/README.md`` holds the method
and the measured numbers.
"""
