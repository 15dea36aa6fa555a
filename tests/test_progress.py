"""`sweep.Progress`: the one status line a sweep writes to stderr (done/total, rate, ETA, errors)."""
import io
import time

from cublaslt_probe.sweep import Progress


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_line_counts_done_rate_eta_and_errors():
    p = Progress(10, stream=io.StringIO())
    p.t0 = time.time() - 10.0          # 10 s in
    p.update(5, errors=2)
    assert p.line() == "[     5/10]  50.0%     0.5 GEMM/s  ETA 0m10s  errors 2"
    p.update(5, errors=1)
    assert p.line().startswith("[    10/10] 100.0%     1.0 GEMM/s  ETA 0m00s  errors 3")


def test_before_anything_ran_the_eta_is_unknown():
    assert Progress(3, stream=io.StringIO()).line().endswith("ETA ?  errors 0")
    assert Progress(0, stream=io.StringIO()).line().startswith("[     0/0] 100.0%")


def test_a_file_gets_one_line_per_update_at_most_every_interval_and_the_last_always():
    out = io.StringIO()
    p = Progress(4, stream=out, every_s=3600)
    for _ in range(4):
        p.update(1)
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 2                         # the first update, then the one that finished
    assert lines[0].startswith("[     1/4]") and lines[1].startswith("[     4/4] 100.0%")


def test_a_terminal_gets_the_line_rewritten_in_place():
    out = Terminal()
    p = Progress(2, stream=out, every_s=0)
    p.update(1)
    p.update(1, errors=1)
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 2 and text.endswith("errors 1\n") and text.count("\n") == 1
