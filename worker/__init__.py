"""Passkey auth-flow worker: the product package (what the image ships).

Module map (docs/architecture.md, "Where each concept lives in the code", has the long form):

    contract     messages.py (wire models, decode_command), catalogue.py (errors), settings.py
    deciding     flow.py (the transitions machine, the pure decision), flowchart.py
    consuming    consumer.py (lanes, watermark commits, rebalances), store.py (state stores,
                 restore), replay.py (read to the high-water mark), timers.py
    doing        execute.py (decode → decide → provider → publish), route.py (a key's home
                 partition; off it, forward), provider/ (adapters, the one error mapping),
                 publish.py (every write, acknowledged)
    processes    app.py (worker), api/ (front-end), webhooks/ (endpoints, dispatcher,
                 signing, SSRF-safe sender), runner.py (a consuming process's life),
                 process.py (signals), eventloop.py, serving.py, probes.py, kafka.py
    operating    metrics.py, logs.py, schemas.py, cli.py (``python -m worker``)
    speed-ups    speedups.py (the optimisations the benchmark keeps, with their oracles)

Development tools (``devstack``) and the benchmark (``bench``) live outside this package.
"""

__version__ = "0.1.0"
