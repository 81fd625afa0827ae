"""How every service quotes a client's value back in an error message.

A client may send a megabyte where a name belongs (a model, a handle, a key);
an error that names the value must not send it back whole. :func:`shown` is
the one rule, used by the dataplane and the runtime alike: quoted, and cut
after 64 characters with the full length said.
"""

from __future__ import annotations

SHOWN_CHARS = 64  # characters of a client's value quoted back in an error


def shown(value: object, limit: int = SHOWN_CHARS) -> str:
    """A client's value as it appears in an error message: quoted, and cut after
    ``limit`` characters with the full length said."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) <= limit:
        return repr(text) if isinstance(value, str) else text
    cut = text[:limit]
    return f"{cut!r}… ({len(text)} characters)" if isinstance(value, str) else f"{cut}…"


def shown_list(values: list[str], most: int = 5) -> str:
    """Several client values, each :func:`shown`, at most ``most`` of them, then how
    many more there were."""
    listed = ", ".join(shown(v) for v in values[:most])
    more = len(values) - most
    return listed + (f" (and {more} more)" if more > 0 else "")
