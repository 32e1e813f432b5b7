"""Progress for people, quiet logs for machines: the one way a long loop reports how far it is.

``progress_bar`` wraps a loop as ``tqdm`` does. On a terminal it *is* a tqdm bar (redrawn in
place with carriage returns). Anywhere else (a pipe, a file, CI, ``make demo > demo.log``) it
draws nothing while the loop runs and writes one line when the loop ends, with the count, the
elapsed time and the last postfix the loop set::

    two-tower: 37/200 epochs in 41.2 s (loss=4.68, ndcg10=0.216, best=29)

so a log holds one line per stage instead of hundreds of carriage-return frames. Every progress
bar of the project goes through here; ``quiet_library_bars`` switches off the bars that libraries
(Hugging Face downloads and weight loading, transformers' GGUF conversion) draw themselves, on the
same condition.

Deliberately left out: nested-bar layout and rate estimates off a terminal (one line per stage
is the point), and any configuration: the stream decides.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import IO, Any, TypeVar

T = TypeVar("T")


def interactive(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default: the current ``sys.stderr``, where progress goes) is a terminal."""
    stream = sys.stderr if stream is None else stream
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False


class StageLine:
    """What ``progress_bar`` returns off a terminal: tqdm's interface, one line at the end.

    Supports what the project's loops use: iteration, ``update``, ``set_postfix``,
    ``set_postfix_str``, ``set_description``, ``close`` and ``with``. ``n`` counts as tqdm's does.
    """

    def __init__(self, iterable: Iterable[T] | None, desc: str, total: int | None, unit: str, initial: int,
                 enabled: bool, stream: IO[str] | None) -> None:
        self.iterable, self.desc, self.unit, self.n = iterable, desc, unit, initial
        self.initial, self.enabled, self.stream, self.postfix = initial, enabled, stream, ""
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.total = total
        self.started, self.closed = time.perf_counter(), False

    def __iter__(self) -> Iterator[Any]:
        if self.iterable is None:
            raise TypeError("progress_bar() without an iterable is updated by hand, not iterated")
        try:
            for item in self.iterable:
                self.n += 1  # counted when started: a loop that breaks after an item has done it
                yield item
        finally:
            self.close()

    def __enter__(self) -> StageLine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, ordered_dict: dict[str, Any] | None = None, refresh: bool = True, **kwargs: Any) -> None:
        items = {**(ordered_dict or {}), **kwargs}
        self.postfix = ", ".join(f"{k}={v}" for k, v in items.items())

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        self.postfix = s

    def set_description(self, desc: str | None = None, refresh: bool = True) -> None:
        self.desc = desc or ""

    def refresh(self) -> None:
        """Nothing to redraw off a terminal."""

    def write(self, s: str) -> None:
        """A message of its own line, as ``tqdm.write`` prints one above the bar."""
        stream = sys.stderr if self.stream is None else self.stream
        stream.write(s + "\n")
        stream.flush()

    def close(self) -> None:
        """Write the stage's line once (when enabled)."""
        if self.closed:
            return
        self.closed = True
        if self.enabled:
            stream = sys.stderr if self.stream is None else self.stream
            stream.write(stage_line(self.desc, self.n, self.total, self.unit, time.perf_counter() - self.started,
                                    self.postfix) + "\n")
            stream.flush()


def stage_line(desc: str, n: int, total: int | None, unit: str, seconds: float, postfix: str = "") -> str:
    """The one line a finished (or stopped) loop leaves in a log.

    >>> stage_line("two-tower", 37, 200, "epoch", 41.23, "loss=4.68, best=29")
    'two-tower: 37/200 epochs in 41.2 s (loss=4.68, best=29)'
    >>> stage_line("eval test", 600, 600, "user", 3.04)
    'eval test: 600 users in 3.0 s'
    """
    count = f"{n}" if total is None or n == total else f"{n}/{total}"
    units = unit if n == 1 or unit.endswith("s") else unit + "s"
    return f"{desc}: {count} {units} in {seconds:.1f} s" + (f" ({postfix})" if postfix else "")


def progress_bar(iterable: Iterable[T] | None = None, *, desc: str, total: int | None = None, unit: str = "step",
                 initial: int = 0, enabled: bool = True, stream: IO[str] | None = None) -> Any:
    """A tqdm bar over ``iterable`` on a terminal, else a ``StageLine`` (one line when it ends).

    ``enabled=False`` shows nothing at all (the callers' ``progress=False``). ``stream`` is where
    the bar or the line goes (default: ``sys.stderr``, looked up at call time).
    """
    if enabled and interactive(stream):
        from tqdm import tqdm  # lazy: quiet_library_bars must run before tqdm's first import

        return tqdm(iterable, desc=desc, total=total, unit=unit, initial=initial, file=stream)
    return StageLine(iterable, desc, total, unit, initial, enabled, stream)


def quiet_library_bars(stream: IO[str] | None = None) -> None:
    """Off a terminal, switch off the progress bars libraries draw themselves (Hugging Face hub
    downloads, transformers' weight loading and GGUF conversion), which would fill a log with frames.

    Off a terminal ``progress_bar`` never creates a tqdm bar, so every tqdm bar there is a library's:
    ``TQDM_DISABLE`` switches them all off, when set before tqdm is first imported (``recsys`` calls
    this first thing; a library that imports tqdm earlier keeps its bars).
    """
    if interactive(stream):
        return
    os.environ.setdefault("TQDM_DISABLE", "1")  # read once, when tqdm is first imported
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # read when huggingface_hub is imported
    if "huggingface_hub" in sys.modules:  # already imported: switch its bars off directly
        from huggingface_hub.utils import disable_progress_bars  # lazy: only when already loaded

        disable_progress_bars()
    if "transformers" in sys.modules:  # it copies the hub's switch when imported
        from transformers.utils import logging as hf_logging  # lazy: only when already loaded

        hf_logging.disable_progress_bar()
