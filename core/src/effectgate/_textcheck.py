"""Text that is not what it looks like: warnings a reviewer sees beside the stored arguments.

A model (or a prompt injection) can write arguments that render differently from what they
are: a right-to-left override that reverses part of an address, a zero-width space inside an
account number, a Cyrillic "а" (or a mathematical "𝖺") inside a Latin domain name, a Cyrillic
"О" (or a fullwidth "０") among the digits of an account number, a ligature "ﬃ" in "oﬃce",
dozens of combining marks stacked on one letter and drawn over the amount beside it. Every
reviewer surface (CLI, web, Jupyter, webhook) shows the warnings of `text_warnings` next to the
values, so an approver sees that the text needs a closer look. The values themselves are always
shown unchanged.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator, Mapping
from typing import Any

# Bidirectional embeddings, overrides and isolates (Trojan Source, CVE-2021-42574), and marks.
_BIDI = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c")
# Characters that render as nothing (or as a plain space) but are not a space to a program.
_INVISIBLE = frozenset(
    "\u200b\u200c\u200d\u2060\u2061\u2062\u2063\u2064\ufeff\u00ad\u180e\u034f\u115f\u1160\u3164\uffa0"
    "\u17b4\u17b5\u180b\u180c\u180d\u180f\u2065\ufff0\ufff1\ufff2\ufff3\ufff4\ufff5\ufff6\ufff7\ufff8"
    "\u2800\U0001d159"  # BRAILLE PATTERN BLANK (a plain space, not one), MUSICAL SYMBOL NULL NOTEHEAD
)
# What must be in one script: a run of text without spaces (a word, and also an address, a
# domain or a URL: "ceo@сосо.com" mixes scripts though each of its words is in one). Prose in two
# languages, word by word, is not flagged.
_TOKEN = re.compile(r"\S+")
_SHOWN = 80  # characters of a mixed-script token quoted in its warning
# Letters of those scripts drawn as a digit (О as 0, З as 3, б as 6, Ӏ as 1): among ASCII digits (an
# account number, an amount as text) one passes for a digit, and digits have no script to mix.
_DIGIT_LIKE = frozenset("\u041e\u043e\u0417\u0437\u04e0\u0431\u04c0\u0406\u039f\u03bf\u0399\u0555\u0585")
#: More combining marks than this on one character (no language needs them: Vietnamese has two)
#: stack above or below it and are drawn over the lines around it (an amount on the next line).
_STACKED = 4
# Scripts whose letters are commonly confused with Latin ones.
_SCRIPTS = ("LATIN", "CYRILLIC", "GREEK", "ARMENIAN", "CHEROKEE")

#: Controls, and the line and paragraph separators (U+2028, U+2029) that break a line where the
#: text shows none (in a browser's <pre>): warned about and written out like control characters.
_BREAKING = ("Cc", "Zl", "Zp")
_HIDDEN = ("Cf", *_BREAKING)


_SELECTORS = re.compile("[\ufe00-\ufe0f\U000e0100-\U000e01ef]")


def _invisible(ch: str) -> bool:
    """A default-ignorable code point (Unicode): rendered as nothing, whatever its category (a
    variation selector after a character it varies is not one: see `_stray`)."""
    return ch in _INVISIBLE or ("\U000e0000" <= ch <= "\U000e0fff" and not _selector(ch))


def _selector(ch: str) -> bool:
    """A variation selector: it picks the glyph of the character before it and renders as
    nothing itself."""
    return _SELECTORS.match(ch) is not None


def _stray(text: str, i: int) -> bool:
    """Whether text[i] is a variation selector with no character to vary (first, or after
    another selector): a run of them carries hidden text, one byte each, and shows none."""
    return _selector(text[i]) and (i == 0 or _selector(text[i - 1]))


def _digit_like(ch: str) -> bool:
    """A letter drawn as a digit (`_DIGIT_LIKE`), or a decimal digit of another block drawn as an
    ASCII one (fullwidth `０`, mathematical `𝟶`): among ASCII digits, another number that reads the same."""
    if ch in _DIGIT_LIKE:
        return True
    digit = not ch.isascii() and unicodedata.category(ch) == "Nd"
    return digit and unicodedata.normalize("NFKC", ch).isascii()


def _stacked(text: str) -> int:
    """The most combining marks (categories Mn, Me) in a row in `text`: those on one character
    (variation selectors aside: a run of them is hidden text, warned about as such; one between
    two marks, drawn as nothing, neither counts nor ends the run, or a selector after each mark
    hid the whole stack)."""
    most = run = 0
    for ch in text:
        if unicodedata.category(ch) not in ("Mn", "Me"):
            run = 0
        elif not _selector(ch):
            run += 1
            most = max(most, run)
    return most


def _script(ch: str) -> str | None:
    if not ch.isascii():  # a variant of a Latin letter (𝖺, ａ, the Roman numeral ⅼ), or a ligature of
        folded = unicodedata.normalize("NFKC", ch)  # them (ﬁ, a letter; not a symbol such as ™)
        if folded.isascii() and folded.isalpha() and (len(folded) == 1 or ch.isalpha()):
            return "LATIN LOOKALIKE"
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    for script in _SCRIPTS:
        if name.startswith(script):
            return script
    return "OTHER"


def _pointers(value: Any, pointer: str = "") -> Iterator[tuple[str, str]]:
    """(JSON pointer, text) for every string in `value`, object keys included."""
    if isinstance(value, str):
        yield pointer or "/", value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            escaped = str(key).replace("~", "~0").replace("/", "~1")
            yield f"{pointer}/{escaped} (key)", str(key)
            yield from _pointers(item, f"{pointer}/{escaped}")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _pointers(item, f"{pointer}/{index}")


def _describe(ch: str) -> str:
    return f"U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')}"


def text_warnings(value: Any, *, limit: int = 20) -> tuple[str, ...]:
    """Warnings for bidirectional controls, invisible characters, other control characters,
    stacked combining marks and runs of text without spaces (words, addresses, domains) that mix
    lookalike scripts or hold a character drawn as a digit among digits, each
    naming where (a JSON pointer) and what; at most `limit` of them (the last says how many
    more there were)."""
    out: list[str] = []
    total = 0
    for pointer, text in _pointers(value):
        if text.isascii() and text.isprintable():
            continue
        found: list[str] = []
        bidi = sorted({c for c in text if c in _BIDI})
        if bidi:
            found.append("bidirectional control " + ", ".join(_describe(c) for c in bidi))
        invisible = sorted({c for c in text if _invisible(c) or unicodedata.category(c) == "Cf"} - set(bidi))
        if invisible:
            found.append("invisible character " + ", ".join(_describe(c) for c in invisible))
        controls = sorted({c for c in text if unicodedata.category(c) in _BREAKING and c not in "\n\t"})
        if controls:
            found.append("control character " + ", ".join(_describe(c) for c in controls))
        strays = [i for i in range(len(text)) if _stray(text, i)] if _SELECTORS.search(text) else []
        if strays:
            found.append(f"{len(strays)} variation selectors with no character to vary (hidden text)")
        for token in _TOKEN.findall(text):
            scripts = {s for s in map(_script, token) if s is not None and s != "OTHER"}
            quoted = token if len(token) <= _SHOWN else token[: _SHOWN - 1] + "…"
            if len(scripts) > 1:
                found.append(f"mixed scripts ({', '.join(sorted(scripts))}) in {quoted!r}")
            elif any("0" <= c <= "9" for c in token) and (odd := sorted(set(filter(_digit_like, token)))):
                found.append(
                    f"{', '.join(map(_describe, odd))} drawn as a digit among the digits of {quoted!r}"
                )
        stacked = _stacked(text)
        if stacked > _STACKED:
            found.append(f"{stacked} combining marks stacked on one character (drawn over text around it)")
        for item in found:
            total += 1
            if len(out) < limit:
                out.append(f"{pointer}: {item}")
    if total > limit:
        out[-1] = f"... and {total - limit + 1} more warnings"
    return tuple(out)


def hidden(ch: str) -> bool:
    """Whether `ch` renders as nothing or reorders the text around it (bidirectional controls,
    zero-width and other format characters, fillers, controls other than newline and tab, line
    and paragraph separators)."""
    return _invisible(ch) or ch in _BIDI or (unicodedata.category(ch) in _HIDDEN and ch not in "\n\t")


def reveal(text: str) -> str:
    """`text` with every character that renders as nothing or reorders the text around it
    (bidirectional controls, zero-width and other format characters, fillers, controls other
    than newline and tab, variation selectors with no character to vary) written out as
    `<U+202E>`, so a reviewer sees where they are."""
    return "".join(f"<U+{ord(c):04X}>" if hidden(c) or _stray(text, i) else c for i, c in enumerate(text))


def card_line(value: Any) -> str:
    """`value` as one line of a text card: `reveal`, and its newlines written out the same way (so
    every control character but tab, ESC and CR too, and every line break): a stored value cannot
    drive the terminal or pass for another line of the card."""
    text = str(value)
    if text.isascii() and text.isprintable():
        return text
    return "".join(f"<U+{ord(c):04X}>" if c == "\n" else c for c in reveal(text))
