"""Dead letters as an operator sees them, and ``python -m worker dlq``."""

__all__ = [
    "cli",
    "letter",
]
