"""The prewarm thread's questions and its queue (CPU; the GPU side is tests/test_gpu_probe.py)."""
import os
import threading
import time

import pytest

from cublaslt_probe.cases import Case
from cublaslt_probe.gpu.heuristic_helpers import HeuristicPrewarm, prewarm_problem
from cublaslt_probe.gpu.lt import Problem
from cublaslt_probe.gpu.operands import CUBLAS_WORKSPACE, lt_problem


def test_each_backend_is_asked_the_question_its_first_call_asks():
    lt = Case("lt", "mm", "bf16", "NT", 16, 4096, 4096)
    assert prewarm_problem(lt, 132) == lt_problem(lt, CUBLAS_WORKSPACE)     # the build's own question, exactly
    assert prewarm_problem(lt, 132).alignment == 16 and prewarm_problem(lt, 132).sm_count is None
    mm = prewarm_problem(Case("torch", "mm", "bf16", "NT", 16, 4096, 4096), 132)
    assert (mm.m, mm.n, mm.k, mm.trans_a, mm.trans_b) == (4096, 16, 4096, "T", "N")   # the column-major problem
    assert (mm.workspace_bytes, mm.alignment, mm.sm_count) == (32 << 20, 256, 132)      # cuBLAS API
    tlt = prewarm_problem(Case("torch-lt", "mm", "fp16", "NN", 16, 4096, 4096), 132)
    assert (tlt.workspace_bytes, tlt.alignment, tlt.sm_count) == (1 << 20, 256, None)  # torch's Lt path
    addmm = prewarm_problem(Case("torch", "addmm", "bf16", "NT", 16, 4096, 4096), 132)
    assert addmm.bias and (addmm.workspace_bytes, addmm.sm_count) == (1 << 20, None)
    narrow = prewarm_problem(Case("torch", "addmm", "bf16", "NT", 16, 1, 4096), 132)  # torch sends it to cuBLAS
    assert (narrow.workspace_bytes, narrow.sm_count) == (32 << 20, 132)
    cupy = prewarm_problem(Case("cupy", "bmm", "fp16", "NN", 16, 64, 64, 8), 114)
    assert (cupy.batch, cupy.sm_count, cupy.workspace_bytes) == (8, 114, 32 << 20)
    # the SM count is part of the question's key: the cuBLAS API's and the lt backend's are two questions
    assert mm.key() != lt_problem(Case("torch", "mm", "bf16", "NT", 16, 4096, 4096), 32 << 20, 256).key()


class Answers:
    """What the thread was asked, on which thread and CPUs; the first answer can be held until released."""

    def __init__(self, hold_first=False, refuse=()):
        self.asked, self.threads, self.cpus = [], set(), set()
        self.started, self.release = threading.Event(), threading.Event()
        self.hold_first, self.refuse = hold_first, set(refuse)

    def __call__(self, p):
        self.threads.add(threading.get_ident())
        self.cpus |= os.sched_getaffinity(0)
        if self.hold_first and not self.asked:
            self.started.set()
            self.release.wait(10)
        self.asked.append(p.m)
        if p.m in self.refuse:
            raise RuntimeError("CUBLAS_STATUS_NOT_SUPPORTED")


def wait_for(cond, s=10.0):
    end = time.time() + s
    while not cond() and time.time() < end:
        time.sleep(0.01)
    assert cond()


def test_the_thread_asks_each_question_once_in_order_on_its_own_cpu():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    answers = Answers(refuse={3})
    pw = HeuristicPrewarm(answers, cpu)
    try:
        pw.ask([Problem(m, 64, 64) for m in (1, 2, 3, 2, 4)])
        pw.ask([Problem(1, 64, 64), Problem(5, 64, 64)])     # asked before: not again
        wait_for(lambda: pw.asked + pw.refused == 5)
        wait_for(pw.idle)
        assert answers.asked == [1, 2, 3, 4, 5]
        assert (pw.asked, pw.refused) == (4, 1)              # refused: left to the first call, the thread goes on
        assert answers.threads and threading.get_ident() not in answers.threads
        assert answers.cpus == {cpu}
        assert os.sched_getaffinity(0) != {cpu} or len(os.sched_getaffinity(0)) == 1   # the caller's are its own
    finally:
        pw.close()
    assert not pw._thread.is_alive()


def test_cancel_drops_the_questions_not_asked_and_waits_for_the_one_being_asked():
    answers = Answers(hold_first=True)
    pw = HeuristicPrewarm(answers)
    try:
        pw.ask([Problem(m, 64, 64) for m in (1, 2, 3)])
        assert answers.started.wait(10)
        assert not pw.idle()                 # one being asked, two queued
        canceller = threading.Thread(target=pw.cancel)
        canceller.start()
        canceller.join(0.3)
        assert canceller.is_alive()          # the question being asked is not cut: cancel waits for it
        answers.release.set()
        canceller.join(10)
        assert not canceller.is_alive()
        assert answers.asked == [1] and pw.idle()   # 2 and 3 were dropped ...
        pw.ask([Problem(m, 64, 64) for m in (1, 2, 3)])
        wait_for(lambda: pw.asked == 3)
        assert answers.asked == [1, 2, 3]    # ... and can be asked again; 1 was asked already
    finally:
        pw.close()


def test_a_closed_prewarm_thread_ends_with_questions_pending():
    answers = Answers(hold_first=True)
    pw = HeuristicPrewarm(answers)
    pw.ask([Problem(m, 64, 64) for m in range(1, 50)])
    assert answers.started.wait(10)
    closer = threading.Thread(target=pw.close)
    closer.start()
    answers.release.set()
    closer.join(10)
    assert not pw._thread.is_alive() and answers.asked == [1]


@pytest.mark.parametrize("n", [HeuristicPrewarm.REMEMBER + 10])
def test_the_questions_remembered_are_bounded(n):
    answers = Answers()
    pw = HeuristicPrewarm(answers)
    try:
        pw.ask([Problem(m, 8, 8) for m in range(1, n + 1)])
        wait_for(lambda: pw.asked == n, 60)
        assert len(pw._asked) <= HeuristicPrewarm.REMEMBER
    finally:
        pw.close()


def test_no_question_is_started_while_the_probe_holds_the_thread():
    answers = Answers()
    pw = HeuristicPrewarm(answers)
    try:
        pw.hold()                    # the probe enqueues timed batches
        pw.ask([Problem(m, 64, 64) for m in (1, 2)])
        time.sleep(0.3)
        assert answers.asked == [] and not pw.idle()
        pw.release()
        wait_for(lambda: pw.asked == 2)
        assert answers.asked == [1, 2]
        pw.hold()
        pw.close()                   # closing a held thread does not wait for a release
        assert not pw._thread.is_alive()
    finally:
        pw.close()


def test_holding_waits_for_the_question_being_asked():
    """`hold` returns once the question in flight is answered: no Python work of the thread's while the probe
    enqueues timed batches."""
    answers = Answers(hold_first=True)
    pw = HeuristicPrewarm(answers)
    held = threading.Event()
    try:
        pw.ask([Problem(m, 64, 64) for m in (1, 2)])
        assert answers.started.wait(10)            # the first question is being asked
        holder = threading.Thread(target=lambda: (pw.hold(), held.set()))
        holder.start()
        time.sleep(0.2)
        assert not held.is_set()                   # still waiting for it
        answers.release.set()
        assert held.wait(10) and answers.asked == [1]
        time.sleep(0.2)
        assert answers.asked == [1]                # and the next is not started while held
        pw.release()
        wait_for(lambda: answers.asked == [1, 2])
    finally:
        answers.release.set()
        pw.close()
