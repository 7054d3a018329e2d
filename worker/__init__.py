"""Passkey auth-flow worker, the product package (what the image ships); ``devstack`` and
``bench`` live outside it. Module map (long form: docs/architecture.md, "Where each concept
lives in the code"):
contract: messages, catalogue (errors), settings · deciding: flow, flowchart · speed-ups: speedups
consuming: consumer (lanes, watermark commits, rebalances), store, replay, timers
doing: execute, route (a key's home partition), provider/ (adapters, error mapping), publish
processes: app (worker), api/ (front-end), webhooks/, runner, process, eventloop, serving,
probes, kafka · operating: metrics, logs, schemas, cli (``python -m worker``)"""

__version__ = "0.1.0"
