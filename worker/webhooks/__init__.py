"""Webhook fan-out building blocks: Standard Webhooks signing (``signing``), endpoint secrets
encrypted at rest (``secrets_box``), the SSRF policy (``targets``) and the outbound HTTP
client that honours it (``sender``)."""
