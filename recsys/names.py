"""What an id (user, item) or a version name may hold: one rule for the loaders, the API and documents.

Refused: C0/C1 control characters (NUL, newline, escape, ...), which break logs, headers and
line-based files, and the invisible *format* characters (Unicode category Cf: zero-width space
and joiners, soft hyphen, bidirectional overrides, the byte-order mark, tag characters, ...).
Two ids that print alike must be one id: ``"alice"`` and ``"alice\\u200b"`` would otherwise be
two users whose events and answers never meet, and a bidi override makes a log line lie about
the id it shows.

``FORBIDDEN`` is a regex character-class body written with ``\\uXXXX`` / ``\\UXXXXXXXX`` escapes,
which Python's ``re``, pandas and pydantic-core's Rust regex all read the same way. The Cf ranges
are Unicode 15's; ``tests/recsys/test_names.py`` checks them against this Python's ``unicodedata``.
"""

from __future__ import annotations

import re
import unicodedata

CONTROL = r"\x00-\x1f\x7f-\x9f"  # C0, DEL and C1
FORMAT = (  # Unicode category Cf
    r"\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200f\u202a-\u202e"
    r"\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    r"\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
FORBIDDEN = CONTROL + FORMAT
NAME_PATTERN = f"^[^{FORBIDDEN}]+$"  # a whole name without a forbidden character
_FORBIDDEN = re.compile(f"[{FORBIDDEN}]")


def forbidden_character(name: str) -> str | None:
    """Why ``name`` may not be an id or version (the first offending character and where), or None.

    >>> forbidden_character("sku-1") is None
    True
    >>> print(forbidden_character("a\\nb"))
    a control character ('\\n' at 1)
    >>> print(forbidden_character("bob\\u200b"))
    an invisible format character (U+200B ZERO WIDTH SPACE at 3)
    """
    found = _FORBIDDEN.search(name)
    if found is None:
        return None
    ch, at = found.group(), found.start()
    if re.fullmatch(f"[{CONTROL}]", ch):
        return f"a control character ({ch!r} at {at})"
    return f"an invisible format character (U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')} at {at})"
