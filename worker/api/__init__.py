"""The HTTP front-end (design.md §8): the seed's passkey-confirm and polling routes over Kafka.

``app`` is the composition root (``build_app``, ``serve_api``), ``replies`` correlates
``auth.replies`` with waiting requests, ``view`` keeps a local read model of ``auth.state``,
``keys`` resolves workspaces from hashed API keys and ``openapi`` is the published contract.
"""
