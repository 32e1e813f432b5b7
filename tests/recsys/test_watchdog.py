"""The deadline-bounded stage call: answers, errors, abandonment, worker reuse, process exit."""

import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from recsys.contract import Candidates, Request
from recsys.watchdog import StageAbandoned, StageWatchdog


class Gate:
    """A stage whose call blocks until ``open`` is set; it records the thread that ran it."""

    name, reads, writes = "slow", (), ()

    def __init__(self, fail: bool = False):
        self.open, self.fail, self.threads = threading.Event(), fail, []

    def load(self, artifact_dir) -> None: ...

    def version(self) -> str:
        return "gate"

    def run(self, request: Request, candidates: Candidates) -> Candidates:
        self.threads.append(threading.current_thread())
        self.open.wait(10)
        if self.fail:
            raise ValueError("backend said no")
        return candidates.with_scores("slow", np.ones(len(candidates), np.float32))


def req(budget_s: float) -> Request:
    return Request(user_id="u", deadline=time.monotonic() + budget_s)


CANDS = Candidates(items=np.array([3, 1, 2]))


def test_an_answer_in_time_is_returned_and_the_worker_is_reused():
    dog, stage = StageWatchdog(), Gate()
    stage.open.set()
    for _ in range(5):
        out = dog.run("slow", stage, req(5.0), CANDS)
        assert out.items.tolist() == [3, 1, 2] and out.order_by == "slow"
    assert len({t.ident for t in stage.threads}) == 1  # one persistent worker served every call
    assert stage.threads[0] is not threading.current_thread() and stage.threads[0].daemon


def test_an_error_reaches_the_caller():
    dog, stage = StageWatchdog(), Gate(fail=True)
    stage.open.set()
    with pytest.raises(ValueError, match="backend said no"):
        dog.run("slow", stage, req(5.0), CANDS)


def test_a_hung_call_is_abandoned_counted_and_released_when_it_returns():
    dog, stage = StageWatchdog(grace_s=0.01, max_abandoned=2), Gate()
    for _ in range(2):
        with pytest.raises(StageAbandoned, match="call abandoned"):
            dog.run("slow", stage, req(0.02), CANDS)
    assert dog.stuck == {"slow": 2}
    with pytest.raises(StageAbandoned, match="2 earlier calls still running"):
        dog.run("slow", stage, req(5.0), CANDS)  # refused at once, no third thread
    assert len(stage.threads) == 2
    stage.open.set()
    deadline = time.monotonic() + 5
    while dog.stuck["slow"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert dog.stuck == {"slow": 0}
    assert dog.run("slow", stage, req(5.0), CANDS).order_by == "slow"  # tried again, answered


def test_concurrent_calls_run_side_by_side():
    dog, stage = StageWatchdog(), Gate()
    outs: list[Candidates] = []
    callers = [threading.Thread(target=lambda: outs.append(dog.run("slow", stage, req(5.0), CANDS)))
               for _ in range(3)]
    for t in callers:
        t.start()
    deadline = time.monotonic() + 5
    while len(stage.threads) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len({t.ident for t in stage.threads}) == 3  # no call waited behind another
    stage.open.set()
    for t in callers:
        t.join()
    assert len(outs) == 3


def test_no_deadline_runs_on_the_calling_thread():
    stage = Gate()
    stage.open.set()
    StageWatchdog().run("slow", stage, Request(user_id="u"), CANDS)
    assert stage.threads == [threading.current_thread()]


def test_a_hung_call_does_not_keep_the_process_from_exiting():
    code = (
        "import time, threading, numpy as np\n"
        "from recsys.contract import Candidates, Request\n"
        "from recsys.watchdog import StageAbandoned, StageWatchdog\n"
        "class Hang:\n"
        "    name = 'hang'\n"
        "    def run(self, request, candidates):\n"
        "        threading.Event().wait()\n"
        "try:\n"
        "    StageWatchdog(grace_s=0.01).run('hang', Hang(), Request(user_id='u', deadline=time.monotonic() + 0.01),\n"
        "                                    Candidates(items=np.array([1])))\n"
        "except StageAbandoned:\n"
        "    print('abandoned')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout.strip()) == (0, "abandoned")
