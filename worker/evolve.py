"""``evolve``: ``dataclasses.replace`` for the frozen, slotted records of the hot path.

``dataclasses.replace`` looks up the fields, checks each one, builds a keyword dict and calls
the generated ``__init__``: about 6 µs for the 14-field ``AccountRecord``, and one confirm
replaces records five times (bench/README.md: half of ``settle_confirm``). ``evolve`` does
the same with one function generated per class (as attrs does for ``evolve``): copy every
slot, overriding the given ones. It runs no ``__post_init__``, so it refuses classes that
define one, and no validation, exactly like ``replace`` on these records.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")

_evolvers: dict[type, Callable[..., Any]] = {}
_UNSET: Any = object()


def evolve(obj: T, /, **changes: Any) -> T:
    """A copy of the dataclass instance ``obj`` with ``changes`` applied."""
    cls = type(obj)
    fn = _evolvers.get(cls)
    if fn is None:
        fn = _evolvers[cls] = _build(cls)
    result: T = fn(obj, **changes)
    return result


def _build(cls: type) -> Callable[..., Any]:
    if not dataclasses.is_dataclass(cls) or "__slots__" not in cls.__dict__:
        raise TypeError(f"evolve needs a slotted dataclass, not {cls.__name__}")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has __post_init__; use dataclasses.replace")
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    if len(names) != len(cls.__dict__["__slots__"]):
        raise TypeError(f"{cls.__name__} has fields outside __init__; use dataclasses.replace")
    params = ", ".join(f"{n}=_UNSET" for n in names)
    body = "".join(f"    _set(new, {n!r}, old.{n} if {n} is _UNSET else {n})\n" for n in names)
    source = f"def evolve(old, /, *, {params}):\n    new = _new(_cls)\n{body}    return new\n"
    scope: dict[str, Any] = {"_UNSET": _UNSET, "_set": object.__setattr__, "_cls": cls}
    scope["_new"] = object.__new__
    exec(compile(source, f"<evolve {cls.__qualname__}>", "exec"), scope)
    fn: Callable[..., Any] = scope["evolve"]
    return fn
