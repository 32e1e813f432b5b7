"""What an id (user, item) or a version name may hold: one rule for the loaders, the API and documents;
and the names of the candidate columns one stage writes and a later one reads.

Refused: C0/C1 control characters (NUL, newline, escape, ...), which break logs, headers and
line-based files, and the format characters that hide or reorder text without changing what is
drawn: zero-width space, word joiner and invisible operators, soft hyphen, the byte-order mark,
the Mongolian vowel separator, the bidirectional marks (the Arabic letter mark too), embeddings,
overrides and isolates, and the interlinear annotation marks. Two ids that print alike must be one id: ``"alice"`` and
``"alice\\u200b"`` would otherwise be two users whose events and answers never meet, and a bidi
override makes a log line show another id than the one it holds.

Refused too: the line and paragraph separators U+2028 and U+2029, which JavaScript, many log
viewers and line-based tools read as a line break, so an id holding one splits a log line.

Allowed, although Unicode also classes them as format characters (Cf), because they change what
is drawn and real text needs them: the zero-width joiner and non-joiner (emoji sequences such as
a family or a profession; Persian and Indic spelling), the tag characters inside a subdivision
flag (U+1F3F4, tag letters or digits, U+E007F CANCEL TAG: the flag of Scotland), and the visible
prepended marks (Arabic number signs, end of ayah, ...). A tag character anywhere else
(``"a\U000e0041"``) is invisible and refused; that check is ``forbidden_character``'s alone, since a
character class cannot say "only inside a flag".

One spelling: ids are compared in Unicode NFC (``canonical``), so canonically equivalent spellings
are one id. ``"café"`` written with a combining acute accent (as macOS file names and some
exports write it) and with the precomposed ``é`` print alike; unnormalised, an interaction file
in one and an item file in the other stopped the load at ``unknown item id 'café'``, a request in
the other form was a cold start, and a rule naming it blocked nothing.

``FORBIDDEN`` is a regex character-class body written with ``\\uXXXX`` escapes, which Python's
``re``, pandas and pydantic-core's Rust regex all read the same way.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable

# Candidate columns (``recsys.contract.Candidates``) the recall stage writes and later stages read:
# per recall channel one raw score ``recall_<channel>`` (NaN where the channel did not return the
# item) and one flag ``src_<channel>``; ``two_tower`` is the channel whose list leads the merge.
RECALL_SCORE_PREFIX, SOURCE_FLAG_PREFIX = "recall_", "src_"
TWO_TOWER = "two_tower"
# The coarse stage's second column: the item model's score (EASE, item-kNN on large catalogs) of each
# candidate from the user's recent items, a feature of the ranker that fusion may also weigh on its own.
ITEM_MODEL = "item_model"

MAX_ID_CHARS = 512  # an id's length in its canonical (NFC) spelling, for the API and the loaders (URLs fit)
# What surrounds an id and is dropped: what ``str.strip`` removes except the separators U+001C..U+001F,
# which Python counts as whitespace and Unicode does not: they are control characters an id must not
# hold, not padding to drop silently (the API's trim leaves them, and refuses them).
WHITESPACE = "".join(ch for ch in map(chr, range(0x3001)) if ch.isspace() and ch not in "\x1c\x1d\x1e\x1f")
CONTROL = r"\x00-\x1f\x7f-\x9f"  # C0, DEL and C1
HIDDEN = (  # format characters that hide or reorder text (see the module doc)
    r"\u00ad\u061c\u180e\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb"
)
SEPARATORS = r"\u2028\u2029"  # line and paragraph separator: line breaks to JavaScript and many log tools
FORBIDDEN = CONTROL + SEPARATORS + HIDDEN
NAME_PATTERN = f"^[^{FORBIDDEN}]+$"  # a whole name without a forbidden character
_FORBIDDEN = re.compile(f"[{FORBIDDEN}]")
TAG_CHARACTERS = "[\U000e0000-\U000e007f]"  # Python's re only (pydantic-core's regex spells \U otherwise)
_TAG = re.compile(TAG_CHARACTERS)
_FLAG = re.compile("\U0001f3f4[\U000e0030-\U000e0039\U000e0061-\U000e007a]+\U000e007f")  # a subdivision flag


def canonical(name: str) -> str:
    """``name`` in Unicode NFC, the one spelling ids are compared in (see the module doc).

    >>> canonical("cafe\u0301") == "caf\u00e9", canonical("sku-1")
    (True, 'sku-1')
    """
    return name if name.isascii() else unicodedata.normalize("NFC", name)


def id_index(ids: Iterable[object]) -> dict[str, int]:
    """``{id: position}`` that also answers each id's canonical spelling: lookups arrive in NFC, and a
    split saved before ids were NFC may hold another spelling. An id spelt exactly wins over another
    id that only normalises to it (old data holding both spellings as two ids keeps both reachable
    by their exact NFC one).

    >>> id_index(["cafe\u0301", "b"]) == {"caf\u00e9": 0, "cafe\u0301": 0, "b": 1}
    True
    """
    exact = {str(v): i for i, v in enumerate(ids)}
    return {**{canonical(k): i for k, i in exact.items() if not k.isascii()}, **exact}


def id_problem(name: str) -> str | None:
    """Why ``name`` (already stripped and canonical) may not be an id, or None: empty, longer than
    ``MAX_ID_CHARS``, or holding a forbidden character: what the loaders (``offline.loaders.checks.ids``)
    and the API (``serving.schemas.ExternalId``) refuse, for rule documents' item ids.

    >>> print(id_problem("x" * 513))
    is 513 characters long (at most 512)
    """
    if not name:
        return "is empty"
    if len(name) > MAX_ID_CHARS:
        return f"is {len(name)} characters long (at most {MAX_ID_CHARS})"
    found = forbidden_character(name)
    return None if found is None else f"contains {found}"


def forbidden_character(name: str) -> str | None:
    """Why ``name`` may not be an id or version (the first offending character and where), or None.

    >>> forbidden_character("sku-1") is None
    True
    >>> print(forbidden_character("a\\nb"))
    a control character ('\\n' at 1)
    >>> print(forbidden_character("bob\\u200b"))
    an invisible format character (U+200B ZERO WIDTH SPACE at 3)
    >>> print(forbidden_character("a\\U000e0041"))
    a tag character outside a subdivision flag (U+E0041 TAG LATIN CAPITAL LETTER A at 1)
    """
    found = _FORBIDDEN.search(name)
    if found is None:
        return _stray_tag(name)
    ch, at = found.group(), found.start()
    if re.fullmatch(f"[{CONTROL}]", ch):
        return f"a control character ({ch!r} at {at})"
    if ch in "\u2028\u2029":
        return f"a line break character (U+{ord(ch):04X} {unicodedata.name(ch)} at {at})"
    return f"an invisible format character (U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')} at {at})"


def _stray_tag(name: str) -> str | None:
    """A tag character outside a well-formed subdivision flag, named with its position, or None."""
    if name.isascii() or not _TAG.search(name):
        return None
    masked = _FLAG.sub(lambda m: "x" * len(m.group()), name)  # flags keep their length: positions hold
    found = _TAG.search(masked)
    if found is None:
        return None
    ch, at = found.group(), found.start()
    return f"a tag character outside a subdivision flag (U+{ord(ch):04X} {unicodedata.name(ch, 'unnamed')} at {at})"
