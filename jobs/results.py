"""Regenerates the result tables in README.md and docs/ from the files under results/.

A table lives between two marker comments in a Markdown file::

    <!-- results:KIND ARG ... -->
    ...generated table, rewritten on every run...
    <!-- /results -->

``python -m jobs.results`` (``make results``) rewrites every such block; ``--check`` rewrites
nothing and exits 1 naming each file whose tables differ from what the result files say. Output
depends only on the result files (no dates, no locale, no machine), so a clean checkout
reproduces the committed tables byte for byte. Arguments are split like a shell line, so a
label with spaces is quoted. Paths are relative to ``results/``; ``FILE#KEY`` reads the report held at a dotted key of the
file (a file holding a run per variant). The kinds:

- ``datasets FILE...``: one row per evaluation report: popularity, recall, coarse and served
  NDCG@10 (mean ± sd over seeds where the report holds several), candidate recall@200.
- ``stages FILE``: one evaluation report, a row per stage: NDCG@10, Recall@10, MRR@10.
- ``compare LABEL=FILE...``: evaluation reports side by side, a column each, on the figures a
  decision turns on (recall and coarse NDCG@10, candidate recall at each depth, final NDCG@10).
- ``fields FILE KEY[=LABEL]...``: chosen values of one file (dotted keys), a row each.
- ``rows FILE KEY COLUMN[=LABEL]...``: the records of a list (or the entries of a dict, named by
  their key) at a dotted key of one file, a row each.
- ``battery FILE``: a ``recsys battery`` report, a row per dataset shape
  (``jobs.evaluation.battery.battery_table``).

Every table is followed by a line naming its result files, with the commit and date of their
provenance. Deliberately left out: prose figures (they link to their file by hand) and plots.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recsys.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"(<!-- results:(?P<spec>[^\n]*?) -->\n)(?P<body>.*?)(<!-- /results -->)", re.DOTALL)
STAGES = (("popularity", "popularity"), ("recall", "two-tower recall"), ("coarse", "LightGBM coarse"),
          ("llm", "LLM re-ranker"), ("final", "served (rules + fusion)"))
METRICS = ("ndcg@10", "recall@10", "mrr@10")


class ResultsError(ValueError):
    """A marker names an unknown kind, a missing file or a key the file does not hold."""


def number(value: Any) -> str:
    """A value as the tables print it: metrics to 4 decimals, large numbers grouped.

    >>> [number(v) for v in (0.125531, 9.356, 17.168, 1234.5, 17778, True, None, "hnsw", [-0.0006, 0.0319])]
    ['0.1255', '9.36', '17.2', '1,234', '17,778', 'yes', '', 'hnsw', '[-0.0006, +0.0319]']
    """
    if value is None:
        return ""
    if isinstance(value, list):  # a confidence interval of a metric difference: signed bounds
        return "[" + ", ".join(("+" if isinstance(v, float) and 0 < v < 1 else "") + number(v) for v in value) + "]"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 1:
            return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"
        return f"{value:.4f}"
    return str(value)


def lookup(doc: Any, key: str, where: str) -> Any:
    """``doc``'s value at a dotted ``key``; a dict key may itself hold dots (``recall@200``)."""
    node, rest = doc, key
    while rest:
        if not isinstance(node, dict):
            raise ResultsError(f"{where}: no {key!r}")
        match = next((k for k in sorted(node, key=len, reverse=True)
                      if rest == k or rest.startswith(k + ".")), None)
        if match is None:
            raise ResultsError(f"{where}: no {key!r}")
        node, rest = node[match], rest[len(match) + 1:]
    return node


def metric(report: dict[str, Any], key: str) -> str:
    """``key`` (``stages.coarse.ndcg@10``) of an evaluation report: ``mean ± sd`` over seeds, or the
    one run's value; blank where the report lacks it (a stage that did not run)."""
    if "summary" in report:
        cell = report["summary"].get(key)
        if cell is None:
            return ""
        return number(float(cell["mean"])) + (f" ± {number(float(cell['sd']))}" if len(cell["values"]) > 1 else "")
    try:
        return number(lookup(report, key, ""))
    except ResultsError:
        return ""


def seeds_of(report: dict[str, Any]) -> str:
    seeds = report.get("seeds") or (report.get("provenance") or {}).get("seeds") or []
    return ", ".join(str(s) for s in seeds) if seeds else "not recorded"


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def datasets_table(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    rows = [[str(r.get("dataset", name)), seeds_of(r), number(r.get("n_users", _per_seed(r, "lists.users"))),
             *(metric(r, f"stages.{s}.ndcg@10") for s in ("popularity", "recall", "coarse", "final")),
             metric(r, "candidate_recall.recall@200")] for name, r in docs]
    return table(["dataset", "seeds", "test users", "popularity", "two-tower recall", "LightGBM coarse",
                  "served", "candidate recall@200"], rows) + ["", "NDCG@10 on the test split; mean ± sd where a file holds several seeds, else one run."]


def _per_seed(report: dict[str, Any], key: str) -> Any:
    """``key`` of a seeds report's first seed (what every seed shares, such as the users evaluated)."""
    first: dict[str, Any] = next(iter((report.get("per_seed") or {}).values()), {})
    try:
        return lookup(first, key, "")
    except ResultsError:
        return None


def stages_table(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    [(_, r)] = docs
    rows = [[label, *(metric(r, f"stages.{s}.{m}") for m in METRICS)]
            for s, label in STAGES if metric(r, f"stages.{s}.ndcg@10")]
    depth = ", ".join(f"{k} {metric(r, f'candidate_recall.{k}')}" for k in _depths(r))
    return table(["stage", "NDCG@10", "Recall@10", "MRR@10"], rows) + [
        "", f"Seed{'s' if ',' in seeds_of(r) else ''} {seeds_of(r)}; candidate recall (target among a stage's candidates): {depth}."]


def _depths(report: dict[str, Any]) -> list[str]:
    """The report's candidate-recall keys in cascade order (``recall@200`` before ``coarse@50``)."""
    if "summary" in report:
        keys = [k.split(".", 1)[1] for k in report["summary"] if k.startswith("candidate_recall.")]
    else:
        keys = list(report.get("candidate_recall", {}))
    return sorted(keys, key=_cascade_order)


def _cascade_order(key: str) -> tuple[int, str]:
    stage = key.split("@")[0]
    return ([s for s, _ in STAGES].index(stage) if stage in dict(STAGES) else len(STAGES), key)


def compare_table(docs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    keys = [("stages.recall.ndcg@10", "two-tower recall NDCG@10")]
    depths = sorted({d for _, r in docs for d in _depths(r)}, key=_cascade_order)
    keys += [(f"candidate_recall.{d}", f"candidate {d}") for d in depths]
    keys += [("stages.coarse.ndcg@10", "coarse NDCG@10"), ("stages.final.ndcg@10", "served NDCG@10")]
    rows = [[label, *(metric(r, key) for _, r in docs)] for key, label in keys]
    return table(["", *(name for name, _ in docs)], rows) + ["", "Test split; mean ± sd where a file holds several seeds, else one run."]


def rows_table(records: Any, cols: list[str], where: str) -> list[str]:
    """A row per record of a list, or per entry of a dict (its key first); ``COLUMN=LABEL`` names a column."""
    pairs = [c.split("=", 1) if "=" in c else [c, c] for c in cols]
    named = isinstance(records, dict)
    items = list(records.items()) if named else [(None, r) for r in records]
    for key, _ in pairs:  # a record may lack a value (a blank cell); a key no record holds is a typo
        if not any(_has(rec, key) for _, rec in items):
            raise ResultsError(f"{where}: no record holds {key!r}")
    body = [[*([str(name)] if named else []), *(number(lookup(rec, key, where)) if _has(rec, key) else ""
                                                for key, _ in pairs)] for name, rec in items]
    return table([*([""] if named else []), *(label for _, label in pairs)], body)


def _has(record: Any, key: str) -> bool:
    try:
        lookup(record, key, "")
    except ResultsError:
        return False
    return True


def source_line(paths: list[str], docs: list[dict[str, Any]], doc_dir: Path, root: Path = ROOT) -> str:
    parts, seen = [], set()
    for path, doc in zip(paths, docs, strict=True):
        if path in seen:
            continue
        seen.add(path)
        prov = doc.get("provenance") or {}
        link = os.path.relpath(root / "results" / path, doc_dir).replace(os.sep, "/")
        when = ", ".join(x for x in (str(prov.get("commit") or "")[:7], str(prov.get("date") or "")[:10],
                                     "provenance backfilled" if prov.get("backfilled") else "") if x)
        parts.append(f"[`results/{path}`]({link})" + (f" ({when})" if when else ""))
    return "Source: " + "; ".join(parts) + "."


def render(spec: str, doc_dir: Path, where: str, root: Path = ROOT) -> str:
    """The Markdown a marker's ``spec`` stands for (without the markers); files under ``root``/results."""
    try:
        kind, *args = shlex.split(spec)
    except ValueError as exc:  # an unclosed quote
        raise ResultsError(f"{where}: {exc} in {spec!r}") from None
    def load(path: str, where: str) -> dict[str, Any]:
        return load_result(root, path, where)

    if not args:
        raise ResultsError(f"{where}: results:{kind} names no result file")
    if kind in ("datasets", "stages", "compare"):
        pairs = [a.split("=", 1) if "=" in a else [Path(a).stem, a] for a in args]
        labels = [p[0] for p in pairs]
        paths, parts = [p[1].split("#", 1)[0] for p in pairs], [p[1].split("#", 1)[1:] for p in pairs]
        docs = [load(p, where) for p in paths]
        reports = [lookup(d, part[0], f"{where}: {p}") if part else d for d, p, part in zip(docs, paths, parts, strict=True)]
        makers: dict[str, Callable[[list[tuple[str, dict[str, Any]]]], list[str]]] = {
            "datasets": datasets_table, "stages": stages_table, "compare": compare_table}
        if kind == "stages" and len(docs) != 1:
            raise ResultsError(f"{where}: results:stages takes one file, got {len(docs)}")
        lines = makers[kind](list(zip(labels, reports, strict=True)))
    elif kind == "fields":
        path, *keys = args
        doc = load(path, where)
        pairs = [k.split("=", 1) if "=" in k else [k, k] for k in keys]
        lines, paths, docs = table(["", "value"], [[lab, number(lookup(doc, k, f"{where}: {path}"))]
                                                  for k, lab in pairs]), [path], [doc]
    elif kind == "battery":
        from jobs.evaluation.battery import battery_table  # lazy: only the battery's tables need it

        if len(args) != 1:
            raise ResultsError(f"{where}: results:battery takes one file, got {len(args)}")
        doc = load(args[0], where)
        lines, paths, docs = battery_table(lookup(doc, "shapes", f"{where}: {args[0]}")).rstrip("\n").split("\n"), \
            [args[0]], [doc]
    elif kind == "rows":
        path, listkey, *cols = args
        doc = load(path, where)
        lines, paths, docs = rows_table(lookup(doc, listkey, f"{where}: {path}"), cols, f"{where}: {path} {listkey}"), \
            [path], [doc]
    else:
        raise ResultsError(f"{where}: unknown table kind {kind!r} (datasets, stages, compare, fields, rows, battery)")
    return "\n".join([*lines, "", source_line(paths, docs, doc_dir, root)]) + "\n"


def load_result(root: Path, path: str, where: str) -> dict[str, Any]:
    """``root``/results/``path`` as a JSON object; a missing or unreadable file names the marker."""
    file = root / "results" / path
    try:
        doc = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{where}: cannot read results/{path} ({exc})") from None
    if not isinstance(doc, dict):
        raise ResultsError(f"{where}: results/{path} is not a JSON object")
    return doc


def regenerate(text: str, doc_path: Path, root: Path = ROOT) -> str:
    """``text`` (the page at ``doc_path``) with every results block rewritten from the files it names."""
    def one(m: re.Match[str]) -> str:
        line = text.count("\n", 0, m.start()) + 1
        where = f"{doc_path.relative_to(root) if doc_path.is_relative_to(root) else doc_path}:{line}"
        return m.group(1) + render(m.group("spec"), doc_path.parent, where, root) + m.group(4)
    return BLOCK.sub(one, text)


def documents(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/, in a fixed order."""
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="Write nothing; exit 1 if any table is out of date.")
    args = ap.parse_args(argv)
    stale = []
    try:
        for path in documents():
            old = path.read_text(encoding="utf-8")
            new = regenerate(old, path)
            if new != old:
                stale.append(path.relative_to(ROOT).as_posix())
                if not args.check:
                    atomic_write_text(path, new)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.check and stale:
        print(f"tables out of date (run make results): {', '.join(stale)}", file=sys.stderr)
        return 1
    print(("rewrote " + ", ".join(stale)) if stale else "every table is up to date", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
