"""No development-process words in the product.

Every tracked file (``git ls-files``) is read: code, comments, docstrings, help texts, tests,
README, docs, and every tracked path. Work-history references (a numbered working period or
tracker item, a test docstring that names the review which found the bug, a result file named
after a tracker item) mean nothing to a user of the product; they belong in commit messages, and
a choice settled by measurement belongs in a decision record that states the figures.

Not scanned: binary files (images), the contents of result files (``results/**.json`` and
``reports/**.json``: measurement data, which may quote dataset text such as a MovieLens title; their names are
scanned), and this file, which holds the examples the patterns must catch (spelt with
placeholders, ``spelt``, so that the words themselves appear nowhere in the tree).

The patterns are narrow on purpose: an HTTP session, ``requests.Session``, "issues a request",
a CSS colour ``#333``, a Markdown heading and a boosting round are all legitimate.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SELF = Path(__file__).resolve().relative_to(ROOT).as_posix()
DATA_DIRS = ("results/", "reports/")  # measurement data: file names scanned, JSON contents not

# name -> pattern, matched case-insensitively against every line and every path
PATTERNS: dict[str, re.Pattern[str]] = {name: re.compile(p, re.IGNORECASE) for name, p in {
    "numbered session": r"(?<![a-z])sessions?[ _-]?\d+",
    "session as a date": r"\b(?:until|before|since)\s+session\b",
    "issue number": r"\bissues?[ _-]?#?\d+(?!\s+(?:requests?|calls?|commands?|queries|reads?|writes?)\b)",
    # a hash number as a reference, not a number: after a word that cites it, possessive, or alone in
    # parentheses; "entries #1-#80" and "the ledger reaches #30" are numbers, not references
    "issue reference": r"\b(?:issues?|prs?|pull requests?|tickets?|pass(?:es)?\s+\d+|fix(?:es|ed)?|closes|see|by)"
                       r"\s+#\d+\b|(?<![\w&#/])#\d+(?:'s|’s)\b|\(#\d+\)",
    "tracker possessive": r"\bthe\s+issue(?:'s|’s)",
    "named review": r"\b(?:hostile|review|audit)\s+(?:pass|round)(?:es|s)?\b",
    "issue-number prefix": r"(?<![a-z0-9])h\d{1,3}_[a-z]",
    "unshipped probe": r"\b(?:the|a)\s+lead(?:'s|’s)?\b(?!\s+(?:to|time|times|in|of|over|on)\b)",
}.items()}
# CSS and SVG colours (#333, #000) are not issue references
HASH_EXEMPT_SUFFIXES = (".css", ".svg")


def findings(path: str, text: str) -> list[str]:
    """``"path:line: <pattern name>: <matched text>"`` for every match in ``text`` (line 0: the path).

    >>> findings("docs/x.md", "fine\\n" + spelt("{U} {S} 17 it was slow"))[0].split(": ")[:2]
    ['docs/x.md:2', 'numbered session']
    """
    out = [f"{path}:0: {name} in the file name: {m.group(0)!r}"
           for name, pattern in PATTERNS.items() for m in pattern.finditer(path)]
    for number, line in enumerate(text.splitlines(), start=1):
        for name, pattern in PATTERNS.items():
            if name == "issue reference" and path.endswith(HASH_EXEMPT_SUFFIXES):
                continue
            out.extend(f"{path}:{number}: {name}: {m.group(0)!r}" for m in pattern.finditer(line))
    return out


def tracked_files() -> list[str]:
    try:
        res = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, timeout=60)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"not a git checkout ({exc}): nothing to scan")
    return [p for p in res.stdout.decode().split("\0") if p]


def readable_text(path: Path) -> str | None:
    """The file as text, or None for a binary file (NUL bytes or not UTF-8) or one deleted from the tree."""
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def test_no_development_process_words_in_the_tracked_tree() -> None:
    found: list[str] = []
    for rel in tracked_files():
        if rel == SELF:
            continue
        is_data = rel.startswith(DATA_DIRS) and rel.endswith(".json")
        text = "" if is_data else readable_text(ROOT / rel)
        found.extend(findings(rel, text or ""))
    assert not found, (f"{len(found)} development-process references (say what the product does instead; "
                       "history goes in commit messages):\n" + "\n".join(found))


PLACEHOLDERS = {"{S}": "sess" + "ion", "{Ic}": "Iss" + "ue", "{Hc}": "Host" + "ile", "{U}": "Unt" + "il",
                "{I}": "iss" + "ue", "{H}": "host" + "ile", "{L}": "le" + "ad", "{R}": "rev" + "iew", "{h}": "h",
                "{#}": "#"}


def spelt(text: str) -> str:
    """``text`` with its placeholders replaced: the examples below, without the words in the source."""
    for key, word in PLACEHOLDERS.items():
        text = text.replace(key, word)
    return text


CAUGHT = [
    "{U} {S} 17 the fit ran on one core.",
    "Before {S} 25 the gate was off.",
    "# 1 GiB since {S} 9: 256 MiB held 11 prompts",
    "reports/{h}18_refit_probe_{S}24_ml100k.json",
    'help="LLM tags for the catalog ({I} 6)."',
    "{Ic} 16 item 8: a LimitError traceback.",
    "the eval report (see {I} {#}3's format)",
    "{Hc} pass 11 {#}8: --artifacts-b on a split",
    "{H} pass 10-13",
    "Threads ({I}-18): one of two cores",
    "cited by {#}46",
    "meets three of {#}18's four criteria",
    "a lift of 0.01 ({#}46)",
    "RECOVERY_BOUND_S = 5.0  # the {I}'s acceptance bound",
    "evaluation (the {L}'s ``recsys eval``)",
    "a probe of CV rounds (a {L}, not shipped)",
    "after the second {R} round",
    "results/{h}19_cold_items_ml100k.json",
    "eval_{S}20.json",
]

LEGITIMATE = [
    "the HTTP session is reused across requests",
    "client = requests.Session()",
    "sessions: each user has several sessions; a session has a focus genre",
    "mean_sessions x mean_session_len",
    "the client issues a request per user",
    "a burst may send 5 requests at once",
    "--bg: #f6f7f9; --panel: #fff; --ink: #1d2330;",
    "# A heading",
    "## Evaluation protocol",
    "stops at round 19 of 300 boosting rounds",
    "byte {body[exc.start]:#04x} at offset",
    "see https://github.com/org/repo/issues/12 upstream",
    "&#8594; an arrow entity",
    "80 lost when Redis came back without them (#1-#80; its ledger reaches #50)",
    "the item ranked #1 for this user",
    "the lead time of an order",
    "this leads to a shorter list",
    "hostile request bodies are refused",
    "h1 { font-size: 2rem }",
    "sha1_digest and h_x_",
]


@pytest.mark.parametrize("line", CAUGHT)
def test_each_kind_of_process_reference_is_caught(line: str) -> None:
    assert findings("docs/page.md", spelt(line)), spelt(line)


@pytest.mark.parametrize("line", LEGITIMATE)
def test_legitimate_words_are_not_flagged(line: str) -> None:
    assert findings("docs/page.md", line) == []


def test_css_colours_of_digits_only_are_not_issue_references_in_stylesheets() -> None:
    assert findings("serving/console/static/console.css", "a { color: #333; background: #000 }") == []
    assert findings("docs/page.md", spelt("fixed by {#}333")) != []


def test_file_names_are_scanned_and_named_as_such() -> None:
    [hit] = findings(spelt("reports/{h}21_llm_bench.json"), "")
    assert hit == spelt("reports/{h}21_llm_bench.json:0: {I}-number prefix in the file name: '{h}21_l'")
