"""The resumable tagging job: fixed chunks, atomic part files, a manifest, a final table.

Items are tagged in item order; chunk ``c`` always holds items ``[c*C, (c+1)*C)`` and is split
into batches the same way every run, so decoding (greedy) sees identical batches whether the
job ran in one go, was killed (SIGKILL included) and rerun, or ran on Ray. A finished chunk is
one Parquet file ``parts/chunk-NNNNN.parquet`` written to a temporary name and renamed, so a
part either exists whole or not at all; each part carries the job version it was made with
(``jobs.tagging.parts``), and the manifest lists the finished parts with their sha256 and item
count and is rebuilt from the parts on every start. A part is done when it can be read, holds at
least the items this run asks of its chunk and still has the sha256 the manifest recorded; a part
the manifest does not vouch for (a kill between its rename and the manifest write, or no usable
manifest) is read whole and kept when it is this version's and holds its chunk's items with their
ids, so such a kill loses nothing. A damaged part (unreadable, or changed since) is removed at
the start and redone. A ``limit`` run tags
the chunks over its first ``limit`` items: its short last part is redone by a later, larger
run, and a part holding more than the limit asks (finished by an earlier run) is kept.
``finalize`` checks the parts cover items ``0..n-1`` of the whole catalog (with their ids)
before it writes anything, then concatenates them into ``tags.parquet`` and ``hidden.npy``
(pooled hidden states, the cache ``jobs.tagging.embed`` trains from; an embedding-only run,
``jobs.tagging.hidden_states``, writes parts and a table of ids only); while they cover fewer
(a ``limit`` run) it writes no table and leaves the one there alone.

A run whose version (model digest, prompt version, schema hash, decoding settings, chunking,
the catalog's item ids; the prompt version is ``t1`` for the built-in prompt, ``t1.<digest>``
for another prompt document) differs from the parts already on disk (each part's own version, or
for parts from before parts carried one, the manifest's) refuses to mix them, and parts whose
version cannot be established (no own version, no usable manifest) are refused too;
``fresh=True`` clears them, in ``start``, which the caller runs only once the model has loaded
(``plan`` before it only reads). A ``limit`` is not part of the version (it only shortens the run).

Deliberately left out: the model (``jobs.tagging.generate``), Ray (``jobs.tagging.ray_engine``).
"""

from __future__ import annotations

import shutil
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from jobs.tagging.catalog import catalog_digest, require_same_items
from jobs.tagging.generate import TaggerSettings
from jobs.tagging.parts import (
    content_problem,
    part_items,
    part_table,
    part_version,
    read_manifest,
    read_part,
    unreadable,
    write_part_table,
)
from jobs.tagging.prompt import PROMPT_VERSION, prompt_description
from jobs.tagging.schema import schema_hash
from llm_rerank.backbone import weights_digest
from llm_rerank.template import DEFAULT, PromptTemplate
from recsys.atomic import atomic_write, atomic_write_json
from recsys.digest import file_sha256, json_sha256
from recsys.progress import progress_bar

VERSION_WORDS = {"catalog": "catalog (the split was prepared again)", "model_digest": "model",
                 "item_text": ("item titles or texts (the split was prepared again, or the parts predate "
                               "this check)"),
                 "prompt_version": "prompt", "schema_hash": "tag schema", "settings": "decoding settings",
                 "chunk_size": "chunk size", "batch_size": "batch size", "categories": "category list"}
TAG_COLUMNS = ("item_idx", "item_id", "genres", "audience", "risk_flags", "themes", "summary", "fallback",
               "reason", "raw", "attempts", "new_tokens")
ID_COLUMNS = ("item_idx", "item_id")
EMBED_METHOD = "embed"  # version["method"] of an embedding-only run (jobs.tagging.hidden_states): no tag columns


@dataclass(frozen=True)
class TagJob:
    """Where a tagging job writes and how its work is cut."""

    out_dir: Path
    items: pd.DataFrame  # the whole catalog, row i = item_idx i (a limit run too)
    version: dict[str, Any]
    chunk_size: int = 64
    batch_size: int = 16
    limit: int | None = None  # tag only the first ``limit`` items this run

    def __post_init__(self) -> None:
        if self.chunk_size < 1 or self.batch_size < 1:
            raise ValueError(f"chunk_size={self.chunk_size} and batch_size={self.batch_size} must be >= 1")
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"limit={self.limit} must be >= 1")

    @property
    def parts(self) -> Path:
        return Path(self.out_dir) / "parts"

    @property
    def stop(self) -> int:
        """One past the last item this run tags: the catalog's size, or the limit within it."""
        return len(self.items) if self.limit is None else min(self.limit, len(self.items))

    @property
    def n_chunks(self) -> int:
        """The chunks this run tags (those over items ``0..stop-1``)."""
        return -(-self.stop // self.chunk_size)

    @property
    def catalog_chunks(self) -> int:
        """The chunks of the whole catalog."""
        return -(-len(self.items) // self.chunk_size)

    def chunk_items(self, chunk: int) -> range:
        """The item_idx values this run puts in ``chunk``: ``[c*C, (c+1)*C)`` cut at ``stop``."""
        return range(chunk * self.chunk_size, min(self.stop, (chunk + 1) * self.chunk_size))

    def chunk_batches(self, chunk: int) -> list[list[dict[str, Any]]]:
        """The item rows of ``chunk`` cut into batches (fixed by item order)."""
        span = self.chunk_items(chunk)
        rows = item_rows(self.items, self.version["categories"], span.start, span.stop)
        return [rows[i : i + self.batch_size] for i in range(0, len(rows), self.batch_size)]

    def part_path(self, chunk: int) -> Path:
        return self.parts / f"chunk-{chunk:05d}.parquet"


def job_version(model_dir: str, schema: dict[str, Any], settings: TaggerSettings, chunk_size: int,
                batch_size: int, item_ids: Sequence[object], template: PromptTemplate = DEFAULT,
                items: pd.DataFrame | None = None) -> dict[str, Any]:
    """Everything the tags depend on; stored in the manifest and in the final outputs.

    ``item_ids`` are the whole split's ids in item_idx order (not a ``limit``'s first rows): the
    catalog the positions of the parts refer to. ``items`` (the split's items table) adds
    ``item_text``, a digest of the titles and texts the prompt reads: the same ids prepared again
    with new titles are other inputs, so their old tags must not count as done.
    """
    genres = schema["properties"]["genres"]["items"]["enum"]
    prompt = PROMPT_VERSION if template.tagging_is_default() else f"{PROMPT_VERSION}.{template.tagging_digest()}"
    version = {"model_digest": weights_digest(model_dir), "prompt_version": prompt,
               "schema_hash": schema_hash(schema), "categories": list(genres), "settings": asdict(settings),
               "chunk_size": chunk_size, "batch_size": batch_size, "catalog": catalog_digest(item_ids)}
    if items is not None:
        version["item_text"] = json_sha256([[str(t), str(x or "")] for t, x in zip(items["title"], items["text"],
                                                                                   strict=True)])[:16]
    return version


def require_tag_columns(frame: pd.DataFrame, source: Path) -> None:
    """A ValueError naming ``source`` when its table holds ids only (an embedding-only run's)."""
    if set(frame.columns) <= set(ID_COLUMNS):
        raise ValueError(f"{source}: holds no tags, only the item ids of an embedding-only run (`recsys tag "
                         "--method embed`): run `recsys tag --fresh` for tags")


def item_rows(items: pd.DataFrame, categories: list[str], start: int, stop: int) -> list[dict[str, Any]]:
    """Tagger input rows for items ``start..stop-1`` (the prompt never sees category labels)."""
    rows = []
    for idx in range(start, stop):
        row = items.iloc[idx]
        title, text = str(row["title"]), str(row["text"] or "")
        rows.append({"item_idx": idx, "title": title, "text": text,
                     "description": prompt_description(title, text, categories, 200)})
    return rows


def plan(job: TagJob, fresh: bool = False) -> tuple[list[int], dict[int, str]]:
    """(the run's chunks still to do, in order; the damaged parts of the catalog: chunk -> why).

    Reads only: parts of another version, or of a version that cannot be established, are refused
    here (unless ``fresh``), but nothing is removed or written until ``start``, so a model that
    then fails to load costs no finished part.
    """
    if fresh:
        return list(range(job.n_chunks)), {}
    manifest, why_not = read_manifest(Path(job.out_dir) / "manifest.json")
    refuse_another_version(job, manifest, why_not)
    recorded = manifest["chunks"] if manifest is not None else {}
    damaged = {c: why for c in range(job.catalog_chunks)
               if (why := part_damage(job, c, recorded.get(job.part_path(c).stem))) is not None}
    pending = [c for c in range(job.n_chunks)
               if c in damaged or (part_items(job.part_path(c)) or 0) < len(job.chunk_items(c))]
    return pending, damaged


def refuse_another_version(job: TagJob, manifest: dict[str, Any] | None, why_not: str) -> None:
    """A ValueError when a readable part on disk was made with another version than ``job``'s (its
    own, else the manifest's), or carries none while there is no usable manifest (``why_not``)."""
    parts = sorted(job.parts.glob("chunk-*.parquet")) if job.parts.exists() else []
    unknown = []
    for path in (p for p in parts if part_items(p) is not None):  # an unreadable part is damaged: redone
        made_with = part_version(path) or (manifest["version"] if manifest is not None else None)
        if made_with is None:
            unknown.append(path.name)
        elif made_with != job.version:
            changed = [VERSION_WORDS.get(k, k) for k in sorted(set(made_with) | set(job.version))
                       if made_with.get(k) != job.version.get(k)]
            raise ValueError(f"{job.parts}: the parts there were made with another {', '.join(changed)} than this "
                             "run; rerun with --fresh (fresh=True) to discard them and start over")
    if unknown:
        raise ValueError(f"{why_not}, and {', '.join(unknown)} in {job.parts} carry no version of their own (written "
                         "before parts recorded it), so what made them cannot be established; rerun with --fresh "
                         "(fresh=True) to discard them and start over")


def start(job: TagJob, fresh: bool = False, damaged: dict[int, str] | None = None) -> None:
    """Make ``job.out_dir`` ready for ``plan``'s chunks: clear the parts when ``fresh``, remove the
    ``damaged`` ones (redone by this run or a later one) and stale temporary files, write the manifest."""
    if fresh and job.parts.exists():
        shutil.rmtree(job.parts)
    job.parts.mkdir(parents=True, exist_ok=True)
    for stale in job.parts.glob(".*.tmp*"):
        stale.unlink()  # a write killed before its rename
    for chunk in damaged or {}:
        job.part_path(chunk).unlink(missing_ok=True)
    write_manifest(job)


def part_damage(job: TagJob, chunk: int, record: dict[str, Any] | None) -> str | None:
    """Why ``chunk``'s part file cannot count as done (unreadable, or neither the file the manifest
    recorded nor a whole part of this job holding the chunk's items); None when it is whole or absent."""
    path = job.part_path(chunk)
    if not path.exists():
        return None
    if (why := unreadable(path)) is not None:
        return why
    if record is not None and record.get("sha256") == file_sha256(path):
        return None
    first = chunk * job.chunk_size
    ids = job.items["item_id"].iloc[first : first + job.chunk_size].astype(str).tolist()
    why = content_problem(path, job.version, first, ids)
    if why is None:
        return None
    unvouched = "its sha256 is not the one manifest.json recorded" if record is not None else "manifest.json does not list it"
    return f"{unvouched}, and {why}"


def write_part(job: TagJob, chunk: int, results: list[dict[str, Any]], parts: Path | None = None) -> None:
    """Commit one chunk atomically (tmp + rename), then refresh the manifest; into ``parts``
    instead of ``job.parts`` (no manifest then) when the caller swaps a whole set in itself."""
    table = part_table(part_frame(job, chunk, results), job.version)
    path = job.part_path(chunk) if parts is None else Path(parts) / job.part_path(chunk).name
    atomic_write(path, lambda fh: write_part_table(fh, table))
    if parts is None:
        write_manifest(job)


def part_frame(job: TagJob, chunk: int, results: list[dict[str, Any]]) -> pd.DataFrame:
    """The part table of ``chunk`` from its tagger results (checked to be the chunk's items, in order)."""
    expected = list(job.chunk_items(chunk))
    got = [r["item_idx"] for r in results]
    if got != expected:
        raise ValueError(f"chunk {chunk}: results cover items {got[:3]}..., expected {expected[:3]}...")
    frame = pd.DataFrame(results)
    frame.insert(1, "item_id", job.items["item_id"].iloc[expected].astype(str).to_numpy())
    frame["hidden"] = [np.asarray(h, dtype=np.float32).tolist() for h in frame["hidden"]]
    columns = ID_COLUMNS if job.version.get("method") == EMBED_METHOD else TAG_COLUMNS
    return frame[list(columns) + ["hidden"]]


def write_manifest(job: TagJob, parts: Path | None = None) -> dict[str, Any]:
    """``manifest.json`` for the part files in ``job.parts`` (or ``parts``, a set about to be swapped in)."""
    chunks = {p.stem: {"sha256": file_sha256(p), "items": part_items(p)}
              for p in sorted(Path(parts or job.parts).glob("chunk-*.parquet"))}
    manifest = {"version": job.version, "n_items": len(job.items), "n_chunks": job.catalog_chunks, "chunks": chunks}
    atomic_write_json(Path(job.out_dir) / "manifest.json", manifest)
    return manifest


def run_local(job: TagJob, tag_batch: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
              pending: list[int], progress: bool = True) -> None:
    """Tag the ``pending`` chunks in this process, committing each as it finishes."""
    done = job.stop - sum(len(b) for c in pending for b in job.chunk_batches(c))
    with progress_bar(total=job.stop, initial=done, desc="tag", unit="item", enabled=progress) as bar:
        for chunk in pending:
            results = []
            for batch in job.chunk_batches(chunk):
                results += tag_batch(batch)
                bar.update(len(batch))
            write_part(job, chunk, results)


def collect_parts(job: TagJob) -> pd.DataFrame:
    """The run's parts (every one must exist), then the catalog's next ones while they follow on
    whole (parts finished by earlier runs past a ``limit``), concatenated."""
    frames: list[pd.DataFrame] = []
    for chunk in range(job.catalog_chunks):
        path = job.part_path(chunk)
        if chunk >= job.n_chunks and (not path.exists() or len(frames[-1]) < job.chunk_size):
            break
        if not path.exists():
            raise FileNotFoundError(f"{path}: chunk {chunk} not tagged yet (rerun the job to resume)")
        frames.append(read_part(path))
    return pd.concat(frames, ignore_index=True)


def finalize(job: TagJob) -> pd.DataFrame:
    """The tags the parts hold (items ``0..m-1``, at least the run's); once they cover the whole
    catalog (``m == n``) also written as ``tags.parquet`` + ``hidden.npy`` + ``version.json``.

    Nothing is written unless the parts hold exactly items ``0..n-1`` of ``job.items``, ids
    included; a table already there is left alone while they cover fewer.
    """
    frame = collect_parts(job)
    got, n = frame["item_idx"].tolist(), len(job.items)
    if got != list(range(len(got))) or len(got) < job.stop or len(got) > n:
        want = range(max(job.stop, min(len(got), n)))
        missing = sorted(set(want) - set(got))
        extra = sorted(set(got) - set(range(n)) | {i for i, k in Counter(got).items() if k > 1})
        raise ValueError(f"{job.parts}: the parts do not hold items 0..{len(want) - 1} once each in order "
                         f"(missing {spans(missing) or 'none'}, extra or repeated {spans(extra) or 'none'}); "
                         "rerun `recsys tag` to redo them, or with --fresh to start over")
    require_same_items(frame["item_id"].tolist(), job.items.iloc[: len(got)], str(job.parts))
    hidden = np.stack([np.asarray(h, dtype=np.float32) for h in frame.pop("hidden")])
    if len(got) < n:
        return frame
    out = Path(job.out_dir)
    atomic_write(out / "tags.parquet", lambda fh: frame.to_parquet(fh, index=False))
    atomic_write(out / "hidden.npy", lambda fh: np.save(fh, hidden, allow_pickle=False))
    atomic_write_json(out / "version.json", job.version)
    return frame


def spans(values: list[int]) -> str:
    """Sorted integers as compact ranges.

    >>> spans([10, 11, 12, 15])
    '10..12, 15'
    """
    out: list[str] = []
    for v in values:
        if out and v == int(out[-1].rsplit("..", 1)[-1]) + 1:
            out[-1] = f"{out[-1].split('..')[0]}..{v}"
        else:
            out.append(str(v))
    return ", ".join(out)
