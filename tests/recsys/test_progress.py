"""Progress bars on a terminal, one line per stage anywhere else (``recsys.progress``)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm import tqdm

from recsys.progress import interactive, progress_bar, stage_line

ROOT = Path(__file__).resolve().parents[2]
RECSYS = Path(sys.executable).with_name("recsys")


class Terminal(io.StringIO):
    """A text stream that says it is a terminal, as a console's stderr does."""

    def isatty(self) -> bool:
        return True


def test_off_a_terminal_a_loop_writes_one_line_when_it_ends_and_no_carriage_return() -> None:
    log = io.StringIO()
    for i in progress_bar(range(5), desc="eval test", unit="user", stream=log):
        assert log.getvalue() == ""  # nothing while the loop runs
        last = i
    assert last == 4
    assert re.fullmatch(r"eval test: 5 users in \d+\.\d s\n", log.getvalue()), log.getvalue()


def test_the_line_carries_the_last_postfix_and_a_stopped_loop_says_how_far_it_got() -> None:
    log = io.StringIO()
    bar = progress_bar(range(1, 201), desc="two-tower", unit="epoch", stream=log)
    for epoch in bar:
        bar.set_postfix(loss=4.68, best=epoch - 1)
        if epoch == 37:
            break
    bar.close()  # closing again (the loop's end already did) writes nothing more
    assert re.fullmatch(r"two-tower: 37/200 epochs in \d+\.\d s \(loss=4\.68, best=36\)\n", log.getvalue())


def test_a_bar_updated_by_hand_counts_from_its_initial_value() -> None:
    log = io.StringIO()
    with progress_bar(total=8, initial=2, desc="tag", unit="item", stream=log) as bar:
        bar.update(2)
        bar.update(2)
        bar.write("a note")
    assert log.getvalue().splitlines()[0] == "a note"
    assert re.fullmatch(r"tag: 6/8 items in \d+\.\d s", log.getvalue().splitlines()[1])


def test_disabled_shows_nothing_anywhere() -> None:
    for stream in (io.StringIO(), Terminal()):
        assert list(progress_bar(range(3), desc="x", enabled=False, stream=stream)) == [0, 1, 2]
        assert stream.getvalue() == ""


def test_on_a_terminal_it_is_a_tqdm_bar_redrawn_in_place() -> None:
    term = Terminal()
    bar = progress_bar(range(3), desc="coarse valid features", unit="user", stream=term)
    assert isinstance(bar, tqdm) and interactive(term)
    assert list(bar) == [0, 1, 2]
    assert "\r" in term.getvalue() and "3/3" in term.getvalue()


def test_stage_line_counts_units_and_leaves_a_complete_total_out() -> None:
    assert stage_line("eval test", 600, 600, "user", 3.04) == "eval test: 600 users in 3.0 s"
    assert stage_line("lists k=10", 1, None, "user", 0.0) == "lists k=10: 1 user in 0.0 s"
    assert stage_line("recall", 3, 10, "queries", 1.26, "p50=1") == "recall: 3/10 queries in 1.3 s (p50=1)"


@pytest.mark.slow
def test_training_into_a_pipe_writes_one_line_per_stage_and_no_progress_frames(tmp_path: Path) -> None:
    """`recsys train ... 2> log` (CI, `make demo > demo.log`): every loop that shows a bar on a terminal
    leaves one line with its count and time, and not one carriage return."""
    config = tmp_path / "tiny.yaml"
    config.write_text("recall: {dim: 16, max_len: 10, n_blocks: 1, n_heads: 1, max_epochs: 4, eval_every: 2, "
                      "use_text: false}\ncoarse: {n_estimators: 20, min_child_samples: 5, early_stopping_rounds: 5, "
                      "train_positions: 2}\n")
    res = subprocess.run([str(RECSYS), "train", "--config", str(config), "--synthetic-users", "60",
                          "--synthetic-items", "120", "--artifacts", str(tmp_path / "art")],
                         capture_output=True, text=True, cwd=ROOT, timeout=600, env={**os.environ, "TERM": "xterm"})
    assert res.returncode == 0, res.stderr
    assert "\r" not in res.stderr and "\r" not in res.stdout
    lines = res.stderr.splitlines()
    assert len([ln for ln in lines if re.fullmatch(r"two-tower: 4 epochs in \d+\.\d s \(loss=.*, best=\d\)", ln)]) == 2
    for stage in ("coarse train candidates", "coarse valid features", "fusion \\(valid\\)"):
        assert any(re.fullmatch(stage + r": \d+ users in \d+\.\d s", ln) for ln in lines), (stage, lines)


def test_library_bars_are_switched_off_off_a_terminal() -> None:
    """transformers draws its own bars (weight loading); off a terminal they are off too, whether it
    was imported before or after the switch."""
    code = ("import sys\nfrom recsys.progress import quiet_library_bars\n"
            "if sys.argv[1] == 'before':\n    import transformers\n"
            "quiet_library_bars()\nfrom transformers.utils import logging\n"
            "print(logging.is_progress_bar_enabled())")
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    for when in ("before", "after"):
        res = subprocess.run([sys.executable, "-c", code, when], capture_output=True, text=True, cwd=ROOT,
                             timeout=300, env=env)
        assert res.stdout.strip() == "False", (when, res.stdout, res.stderr)


def test_a_library_bar_of_plain_tqdm_draws_nothing_off_a_terminal() -> None:
    """transformers' GGUF conversion draws a plain tqdm bar (272 frames in `make demo`'s log)."""
    code = ("from recsys.progress import quiet_library_bars\nquiet_library_bars()\n"
            "from tqdm.auto import tqdm\nprint(sum(1 for _ in tqdm(range(50), desc='Converting tensors')))")
    env = {k: v for k, v in os.environ.items() if k != "TQDM_DISABLE"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
    assert (res.returncode, res.stdout, res.stderr) == (0, "50\n", "")
