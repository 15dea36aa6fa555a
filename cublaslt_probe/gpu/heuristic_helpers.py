"""The probe's heuristic helpers: the companion process that times the heuristic on another core while the
probe times GEMMs (`HeuristicCompanion`), and the prewarm thread that asks cuBLASLt each GEMM's first question
ahead of its first call (`HeuristicPrewarm`, `prewarm_problem`). Which probe starts them: `probe.uses_helpers`."""
from __future__ import annotations

import os
import time

from cublaslt_probe.analysis.evidence import heuristic_workspace, library_path
from cublaslt_probe.cases import Case
from cublaslt_probe.errors import CaptureError
from cublaslt_probe.gpu.operands import CUBLAS_WORKSPACE, lt_problem


def heuristic_groups(items, workspace_of) -> tuple[dict, dict]:
    """The records of `items` grouped by the heuristic question their Case asks ({key: [records]}), and each
    question's Problem ({key: Problem}); the key is the Problem as a tuple."""
    groups: dict[tuple, list[dict]] = {}
    problems: dict[tuple, object] = {}
    for rec, c in items:
        p = lt_problem(c, workspace_of(c))
        key = p.key()
        groups.setdefault(key, []).append(rec)
        problems[key] = p
    return groups, problems


class HeuristicCompanion:
    """The process that times the heuristic while the probe times GEMMs (`lt.serve_heuristics`): asked each
    question as its GEMM is prepared, it answers on another core; the probe collects the answers at the
    end of the window. Its cuBLASLt is another instance of the same library file (`path`, loaded without
    torch), on the same GPU, so a miss costs what it costs torch, and switching its cache off leaves torch's
    alone."""

    START_S = 120.0   # a companion not ready by then (loading cuBLASLt, paying its set-ups) is given up

    def __init__(self, cpu: int | None = None, path: str | None = None):
        import multiprocessing
        ctx = multiprocessing.get_context("spawn")  # never fork a process holding a CUDA context
        self.conn, child = ctx.Pipe()
        from cublaslt_probe.gpu import lt
        self.proc = ctx.Process(target=lt.serve_heuristics, args=(child, cpu, path), daemon=True,
                                name="cublaslt-probe-heuristics")
        self.proc.start()
        child.close()
        self.started = time.perf_counter()
        self.ready: str | None = None
        self.ready_after_s: float | None = None   # from its spawn to its "ready"
        self.asked: set = set()       # questions asked and not yet collected
        self.answers: dict = {}       # key -> (miss_us, hit_us, error, busy_s)

    def poll_ready(self) -> bool:
        """Is the companion ready (its library loaded, its set-ups paid)? Never waits; raises CaptureError when
        it could not start, or is not ready START_S after its spawn."""
        if self.ready is None:
            if self.conn.poll():
                self.wait_ready()
            elif time.perf_counter() - self.started > self.START_S:
                raise CaptureError(f"the heuristic companion was not ready after {self.START_S:.0f} s")
        return self.ready is not None

    def wait_ready(self) -> None:
        """Wait until the companion has loaded its library and paid its set-ups (`lt.set_up`)."""
        if self.ready is not None:
            return
        if not self.conn.poll(max(0.0, self.START_S - (time.perf_counter() - self.started))):
            raise CaptureError(f"the heuristic companion was not ready after {self.START_S:.0f} s")
        try:
            state, what = self.conn.recv()
        except (EOFError, OSError) as e:
            raise CaptureError(f"the heuristic companion ended before it was ready ({e!r})") from e
        if state != "ready":
            raise CaptureError(f"the heuristic companion could not start: {what}")
        self.ready = what
        self.ready_after_s = time.perf_counter() - self.started

    def _drain(self, block: bool) -> None:
        try:
            while block or self.conn.poll():
                for ident, *res in self.conn.recv():
                    self.answers[ident] = tuple(res)
                block = False
        except (EOFError, OSError) as e:
            raise CaptureError(f"the heuristic companion ended ({e!r})") from e

    def ask(self, key: tuple, problem, reps: int) -> None:
        if key in self.asked:
            return
        self.wait_ready()
        self._drain(False)   # read what is answered first, so that neither side blocks on a full pipe
        try:
            self.conn.send((key, problem, reps))
        except (OSError, ValueError) as e:
            raise CaptureError(f"the heuristic companion ended ({e!r})") from e
        self.asked.add(key)

    def collect(self, keys: list) -> list[tuple]:
        """(miss_us, hit_us, error, busy_s) for each asked key, waiting for those not answered yet."""
        while any(k not in self.answers for k in keys):
            if not self.proc.is_alive() and not self.conn.poll():
                raise CaptureError(f"the heuristic companion ended (exit code {self.proc.exitcode})")
            self._drain(True)
        out = [self.answers.pop(k) for k in keys]
        self.asked.difference_update(keys)
        return out

    def close(self) -> None:
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
        self.conn.close()


def prewarm_problem(c: Case, sm_count: int):
    """The heuristic question the first call of `c` asks cuBLASLt, as this process can ask it directly
    (`HeuristicPrewarm`): the column-major problem with its path's workspace limit (`heuristic_workspace`);
    the lt backend's exactly (its build asks it); on torch's cuBLASLt path and the cuBLAS API, the 256-byte
    alignment of the operands' pointers (views of the operand pools, and outputs from torch's allocator), and
    on the cuBLAS API the SM count its log line shows (`smCountTarget`)."""
    path = library_path(c.backend, c.op, c.n, c.k)
    if path == "lt":
        return lt_problem(c, CUBLAS_WORKSPACE)
    p = lt_problem(c, heuristic_workspace(c.backend, c.op, c.n, c.k), alignment=256)
    if path == "cublas":
        p.sm_count = sm_count
    return p


class HeuristicPrewarm:
    """A thread of the probe's process that asks cuBLASLt, ahead of the probe, the heuristic question each
    GEMM of a window will ask on its first call (`prewarm_problem`), so that the first call finds the answer in
    the library's cache, which is the process's, shared by torch's cuBLAS and cuBLASLt paths and a direct call.
    A heuristic miss is most of a fresh GEMM's first call on the host; a hit costs a few µs
    (docs/decisions.md, "The prewarm thread").
    The answer is the library's own for the question, so the kernel chosen does not change; a question
    cuBLASLt refuses is left to the first call. Asking writes no cuBLASLt log line at level 2.

    `ask(problems)` queues questions (one asked before in this process is not asked again); `hold()` and
    `release()` bracket the probe's enqueueing of timed batches, when no question is being asked; `idle()` says
    whether all are answered (the probe asks the companion its questions then, not alongside); `cancel()` drops
    those not asked yet and waits for the one being asked; `close()` ends the thread. `answer(problem)` is
    what the thread runs for each (the probe's: one `cublasLtMatmulAlgoGetHeuristic` call); `cpu`, the
    logical CPU the thread runs on (None: the process's)."""

    REMEMBER = 4096   # questions remembered as asked (the library's cache holds 8192 answers by default)

    def __init__(self, answer, cpu: int | None = None):
        import collections
        import threading
        self._answer = answer
        self._todo: collections.deque = collections.deque()
        self._cv = threading.Condition()
        self._busy = threading.Lock()
        self._asked: set = set()
        self._closed = False
        self._held = False   # the probe enqueues timed batches (`hold`)
        self.asked = 0     # questions answered by the thread
        self.refused = 0   # questions the library refused (left to the first call)
        self._thread = threading.Thread(target=self._run, args=(cpu,), name="cublaslt-probe-prewarm", daemon=True)
        self._thread.start()

    def ask(self, problems) -> None:
        with self._cv:
            for p in problems:
                key = p.key()
                if key in self._asked:
                    continue
                if len(self._asked) >= self.REMEMBER:
                    self._asked.clear()
                self._asked.add(key)
                self._todo.append(p)
            self._cv.notify()

    def hold(self) -> None:
        """Ask no new question until `release`, and wait for the one being asked: the probe is about to enqueue
        timed batches, and the thread's Python work between its cuBLASLt calls would take the interpreter's
        lock from the launching thread (which lets it go at each event it records)."""
        with self._cv:
            self._held = True
        self._wait_for_answer()

    def release(self) -> None:
        with self._cv:
            self._held = False
            self._cv.notify()

    def idle(self) -> bool:
        """Nothing queued and nothing being asked."""
        with self._cv:
            return not self._todo and not self._busy.locked()

    def cancel(self) -> None:
        with self._cv:
            for p in self._todo:
                self._asked.discard(p.key())
            self._todo.clear()
        self._wait_for_answer()

    def _wait_for_answer(self) -> None:
        """Return once the question being asked, if any, is answered."""
        with self._busy:
            pass

    def close(self) -> None:
        with self._cv:
            self._closed = True
            self._todo.clear()
            self._cv.notify()
        self._thread.join(10)

    def _run(self, cpu: int | None) -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})   # this thread only
        while True:
            with self._cv:
                while (not self._todo or self._held) and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                p = self._todo.popleft()
                self._busy.acquire()
            try:
                self._answer(p)
                self.asked += 1
            except Exception:  # noqa: BLE001  the first call will ask it (and meet the error) itself
                self.refused += 1
            finally:
                self._busy.release()
