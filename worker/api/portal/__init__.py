"""The webhook portal: scoped, stateless session tokens and the static page that uses them
(docs/api.md, "The portal")."""

__all__ = [
    "page",
    "revocations",
    "sessions",
    "tokens",
]
