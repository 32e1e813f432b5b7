"""A directory of outputs replaced as a set: built in a temporary sibling, then swapped in.

``staged_dir(target)`` yields an empty ``.<name>.tmp<pid>`` beside ``target`` (the name
``recsys.atomic.tmp_path`` gives a file write); the caller writes every output there. When the
block ends normally the old ``target`` is renamed aside and the new one renamed into its place,
then the old one removed; when it raises, the temporary directory is removed and ``target`` is
untouched. A reader sees the old set or the new one, never new embeddings beside an old index
(``jobs.tagging.embed``) or half a saved model (``jobs.tagging.adapt``).

Deliberately left out: the instant between the two renames, when ``target`` is absent (a
reader then finds nothing rather than a torn set); temporary directories of killed writers,
which stay behind as dot-directories.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from recsys.atomic import tmp_path


@contextmanager
def staged_dir(target: Path) -> Iterator[Path]:
    """Yield a fresh temporary sibling of ``target``; swap it in for ``target`` if the block succeeds."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path(target)
    old = target.with_name(f".{target.name}.old{os.getpid()}")
    for leftover in (tmp, old):  # this process's own, from an earlier call that was interrupted
        shutil.rmtree(leftover, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if target.exists():
            os.replace(target, old)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not target.exists():
            os.replace(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)
