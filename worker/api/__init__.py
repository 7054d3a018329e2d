"""The HTTP front-end: the contract's passkey-confirm and polling routes over Kafka
(docs/architecture.md, "The front-end"; docs/api.md).

``app`` is the composition root (``build_app``, ``api_runtime``, ``serve_api``); ``routes``
holds the handlers, ``middleware`` the request-id/CORS/error/metrics layer, ``cors`` the CORS
policy, ``bodies`` the response models, ``openapi`` the contract generated from them,
``runtime`` the HTTP server loop; ``replies`` correlates ``auth.replies`` with waiting
requests, ``view`` keeps a local read model of ``auth.state`` and ``keys`` resolves
workspaces from hashed API keys.
"""
