"""What every process runs on: signals, the event loop, probes, metrics, logs, tracing."""
