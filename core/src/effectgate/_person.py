"""Who a person is, for the rules that count people: two distinct approvers, and no approving
one's own call. Ids are the application's, and one person is not two because of how an id was
spelled: ids that differ only in case, Unicode normalisation (a composed or decomposed "á"),
invisible characters (format ones: zero-width, bidi marks; and the others that render as nothing,
as the card's text check calls them: a variation selector, a combining grapheme joiner, a Hangul
filler) or surrounding whitespace name one person ("pia", "PIA", "pia " are one reviewer). The ids
are stored as given; only these rules compare them this way (the gate, the audit and the inbox)."""

from __future__ import annotations

import functools
import unicodedata

from ._textcheck import _invisible, _selector


def person(identity: str) -> str:
    """The form of `identity` the people rules compare (anything but text as it is)."""
    if type(identity) is str and identity.isascii():  # the usual id: no cache (the audit meets many)
        return identity.strip().lower()
    return _unusual(identity)


@functools.lru_cache(maxsize=1024)
def _unusual(identity: str) -> str:
    if type(identity) is not str:
        return identity
    text = "".join(
        c for c in identity if not (unicodedata.category(c) == "Cf" or _invisible(c) or _selector(c))
    )
    return unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold()).strip()
