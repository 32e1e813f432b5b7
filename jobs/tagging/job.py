"""The resumable tagging job: fixed chunks, atomic part files, a manifest, a final table.

Items are tagged in item order; chunk ``c`` always holds items ``[c*C, (c+1)*C)`` and is split
into batches the same way every run, so decoding (greedy) sees identical batches whether the
job ran in one go, was killed (SIGKILL included) and rerun, or ran on Ray. A finished chunk is
one Parquet file ``parts/chunk-NNNNN.parquet`` written to a temporary name and renamed, so a
part either exists whole or not at all; the manifest lists the finished parts with their
sha256 and item count and is rebuilt from the parts on every start, so a kill between the
rename and the manifest write loses nothing. A part is done when it holds every item of its
chunk: the short last part of a ``limit`` run is redone by a later, larger run. ``finalize``
checks the parts cover items ``0..n-1`` (with their ids) before it overwrites anything, then
concatenates them into ``tags.parquet`` and ``hidden.npy`` (pooled hidden states, the cache
``jobs.tagging.embed`` trains from).

A run whose version (model digest, prompt version, schema hash, decoding settings, chunking,
the catalog's item ids; the prompt version is ``t1`` for the built-in prompt, ``t1.<digest>``
for another prompt document) differs from the parts already on disk refuses to mix them;
``fresh=True`` clears them. A ``limit`` is not part of the version (it only shortens the run).

Deliberately left out: the model (``jobs.tagging.generate``), Ray (``jobs.tagging.ray_engine``).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
from tqdm import tqdm

from jobs.tagging.catalog import catalog_digest, require_same_items
from jobs.tagging.generate import TaggerSettings
from jobs.tagging.prompt import PROMPT_VERSION, prompt_description
from jobs.tagging.schema import schema_hash
from llm_rerank.backbone import weights_digest
from llm_rerank.template import DEFAULT, PromptTemplate
from recsys.atomic import atomic_write, atomic_write_json
from recsys.digest import file_sha256

VERSION_WORDS = {"catalog": "catalog (the split was prepared again)", "model_digest": "model",
                 "prompt_version": "prompt", "schema_hash": "tag schema"}
TAG_COLUMNS = ("item_idx", "item_id", "genres", "audience", "risk_flags", "themes", "summary", "fallback",
               "reason", "raw", "attempts", "new_tokens")


@dataclass(frozen=True)
class TagJob:
    """Where a tagging job writes and how its work is cut."""

    out_dir: Path
    items: pd.DataFrame  # canonical items table, row i = item_idx i
    version: dict[str, Any]
    chunk_size: int = 64
    batch_size: int = 16

    def __post_init__(self) -> None:
        if self.chunk_size < 1 or self.batch_size < 1:
            raise ValueError(f"chunk_size={self.chunk_size} and batch_size={self.batch_size} must be >= 1")

    @property
    def parts(self) -> Path:
        return Path(self.out_dir) / "parts"

    @property
    def n_chunks(self) -> int:
        return -(-len(self.items) // self.chunk_size)

    def chunk_items(self, chunk: int) -> range:
        """The item_idx values ``chunk`` holds when done: ``[c*C, (c+1)*C)`` cut at the job's items."""
        return range(chunk * self.chunk_size, min(len(self.items), (chunk + 1) * self.chunk_size))

    def chunk_batches(self, chunk: int) -> list[list[dict[str, Any]]]:
        """The item rows of ``chunk`` cut into batches (fixed by item order)."""
        span = self.chunk_items(chunk)
        rows = item_rows(self.items, self.version["categories"], span.start, span.stop)
        return [rows[i : i + self.batch_size] for i in range(0, len(rows), self.batch_size)]

    def part_path(self, chunk: int) -> Path:
        return self.parts / f"chunk-{chunk:05d}.parquet"


def job_version(model_dir: str, schema: dict[str, Any], settings: TaggerSettings, chunk_size: int,
                batch_size: int, item_ids: Sequence[object], template: PromptTemplate = DEFAULT) -> dict[str, Any]:
    """Everything the tags depend on; stored in the manifest and in the final outputs.

    ``item_ids`` are the whole split's ids in item_idx order (not a ``limit``'s first rows): the
    catalog the positions of the parts refer to.
    """
    genres = schema["properties"]["genres"]["items"]["enum"]
    prompt = PROMPT_VERSION if template.tagging_is_default() else f"{PROMPT_VERSION}.{template.tagging_digest()}"
    return {"model_digest": weights_digest(model_dir), "prompt_version": prompt,
            "schema_hash": schema_hash(schema), "categories": list(genres), "settings": asdict(settings),
            "chunk_size": chunk_size, "batch_size": batch_size, "catalog": catalog_digest(item_ids)}


def item_rows(items: pd.DataFrame, categories: list[str], start: int, stop: int) -> list[dict[str, Any]]:
    """Tagger input rows for items ``start..stop-1`` (the prompt never sees category labels)."""
    rows = []
    for idx in range(start, stop):
        row = items.iloc[idx]
        title, text = str(row["title"]), str(row["text"] or "")
        rows.append({"item_idx": idx, "title": title, "text": text,
                     "description": prompt_description(title, text, categories, 200)})
    return rows


def prepare(job: TagJob, fresh: bool = False) -> list[int]:
    """Check/initialise ``job.out_dir``; the chunks still to do, in order."""
    manifest_path = Path(job.out_dir) / "manifest.json"
    if fresh and job.parts.exists():
        shutil.rmtree(job.parts)
    if manifest_path.exists() and job.parts.exists() and any(job.parts.glob("chunk-*.parquet")):
        on_disk = json.loads(manifest_path.read_text())["version"]
        if on_disk != job.version:
            changed = [VERSION_WORDS.get(k, k) for k in sorted(set(on_disk) | set(job.version))
                       if on_disk.get(k) != job.version.get(k)]
            raise ValueError(f"{job.parts}: the parts there were made with another {', '.join(changed)} than this "
                             "run; rerun with --fresh (fresh=True) to discard them and start over")
    job.parts.mkdir(parents=True, exist_ok=True)
    for stale in job.parts.glob(".*.tmp*"):
        stale.unlink()  # a write killed before its rename
    write_manifest(job)
    return [c for c in range(job.n_chunks) if part_items(job.part_path(c)) != len(job.chunk_items(c))]


def part_items(path: Path) -> int | None:
    """How many items the part file ``path`` holds (from its Parquet footer); None when absent."""
    return pq.read_metadata(path).num_rows if path.exists() else None


def write_part(job: TagJob, chunk: int, results: list[dict[str, Any]]) -> None:
    """Commit one chunk atomically (tmp + rename), then refresh the manifest."""
    expected = list(job.chunk_items(chunk))
    got = [r["item_idx"] for r in results]
    if got != expected:
        raise ValueError(f"chunk {chunk}: results cover items {got[:3]}..., expected {expected[:3]}...")
    frame = pd.DataFrame(results)
    frame.insert(1, "item_id", job.items["item_id"].iloc[expected].astype(str).to_numpy())
    frame["hidden"] = [np.asarray(h, dtype=np.float32).tolist() for h in frame["hidden"]]
    atomic_write(job.part_path(chunk), lambda fh: frame[list(TAG_COLUMNS) + ["hidden"]].to_parquet(fh, index=False))
    write_manifest(job)


def write_manifest(job: TagJob) -> dict[str, Any]:
    chunks = {p.stem: {"sha256": file_sha256(p), "items": part_items(p)}
              for p in sorted(job.parts.glob("chunk-*.parquet"))}
    manifest = {"version": job.version, "n_items": len(job.items), "n_chunks": job.n_chunks, "chunks": chunks}
    atomic_write_json(Path(job.out_dir) / "manifest.json", manifest)
    return manifest


def run_local(job: TagJob, tag_batch: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
              pending: list[int], progress: bool = True) -> None:
    """Tag the ``pending`` chunks in this process, committing each as it finishes."""
    done = len(job.items) - sum(len(b) for c in pending for b in job.chunk_batches(c))
    with tqdm(total=len(job.items), initial=done, desc="tag", unit="item", disable=not progress) as bar:
        for chunk in pending:
            results = []
            for batch in job.chunk_batches(chunk):
                results += tag_batch(batch)
                bar.update(len(batch))
            write_part(job, chunk, results)


def iter_parts(job: TagJob) -> Iterator[pd.DataFrame]:
    for chunk in range(job.n_chunks):
        path = job.part_path(chunk)
        if not path.exists():
            raise FileNotFoundError(f"{path}: chunk {chunk} not tagged yet (rerun the job to resume)")
        yield pd.read_parquet(path)


def finalize(job: TagJob) -> pd.DataFrame:
    """Concatenate all parts into ``tags.parquet`` + ``hidden.npy`` + ``version.json``; the tags.

    Nothing is written unless the parts hold exactly items ``0..n-1`` of ``job.items``, ids included.
    """
    frame = pd.concat(list(iter_parts(job)), ignore_index=True)
    got = frame["item_idx"].tolist()
    if got != list(range(len(job.items))):
        missing = sorted(set(range(len(job.items))) - set(got))
        extra = sorted(set(got) - set(range(len(job.items))) | {i for i, n in Counter(got).items() if n > 1})
        raise ValueError(f"{job.parts}: the parts do not hold items 0..{len(job.items) - 1} once each in order "
                         f"(missing {spans(missing) or 'none'}, extra or repeated {spans(extra) or 'none'}); "
                         "rerun `recsys tag` to redo them, or with --fresh to start over")
    require_same_items(frame["item_id"].tolist(), job.items, str(job.parts))
    hidden = np.stack([np.asarray(h, dtype=np.float32) for h in frame.pop("hidden")])
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
