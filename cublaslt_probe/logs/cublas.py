"""cuBLAS's own API log (``CUBLAS_LOGINFO_DBG=1``) → `CublasCall` records.

A call is a header line followed by its argument lines::

    I! cuBLAS (v13.1.0) function cublasStatus_t cublasGemmEx(cublasHandle_t, ...) called:
    i!  handle: type=cublasHandle_t; val=POINTER (IN HEX:0x...)
    i!  m: type=int; val=4096
    i!  Time: ...

Arguments only: this log carries no algo. Other ``i!`` lines (time, process, thread, GPU, ...) go to
``info``. Like `parse_log`, the parser streams and never raises on a bad line.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterator

from cublaslt_probe.logs._io import READ_ERRORS, LogReadError, Source, describe_read_error, open_lines, source_name
from cublaslt_probe.logs.record import ParseStats, op_letter

_CALL = re.compile(r"I! cuBLAS \(v?([^)]*)\) function (.*?)(?: called)?:?\s*\Z")
_ARG = re.compile(r"i!\s*(\w+): type=(.*?); val=(.*)\Z")
_INFO = re.compile(r"i!\s*([A-Za-z][\w ]*?)\s*:\s*(.*)\Z")
_INFO_PAIRS = re.compile(r"i!\s*(\w+=.*)\Z")
_FUNC = re.compile(r"(\w+)\s*\(")
_ENUM = re.compile(r"(.*?)\((-?\d+)\)\Z")
_LT_LINE = re.compile(r"\[\d{4}-\d\d-\d\d [\d:.]+\]\[\w+\]\[\d+\]\[")


@dataclass(slots=True)
class CublasCall:
    """One cuBLAS API call: its function, library version and arguments ``(name, type, value)``.

    ``args`` keeps the log's text (``val=CUBLAS_OP_T(1)``); `value` and the properties ``m``, ``n``,
    ``k``, ``op_a``, ``op_b``, ``a_type`` ... give them cleaned. ``info`` holds the other ``i!``
    lines (``Time``, ``Process``, ``Thread``, ``GPU``, ``Handle``, ``StreamId``, ``MathMode``,
    ``COMPILED WITH``).
    """

    line: int
    function: str
    version: str
    signature: str
    args: list[tuple[str, str, str]] = field(default_factory=list)
    info: dict[str, str] = field(default_factory=dict)
    time: str | None = None
    pid: int | None = None
    file: str | None = None

    def arg(self, name: str, default: str | None = None) -> str | None:
        """The value of argument `name` as logged (a string), or `default`."""
        for n, _, v in self.args:
            if n == name:
                return v
        return default

    def value(self, name: str):
        """Argument `name` cleaned: ints as int, ``CUBLAS_OP_T(1)`` → ``CUBLAS_OP_T``, else the text."""
        v = self.arg(name)
        if v is None:
            return None
        try:
            return int(v)
        except ValueError:
            pass
        m = _ENUM.match(v)
        return m.group(1) if m else v

    def _int(self, name: str) -> int | None:
        v = self.value(name)
        return v if isinstance(v, int) else None

    def _type(self, name: str) -> str | None:
        v = self.value(name)
        if not isinstance(v, str):
            return None
        for prefix in ("CUDA_", "CUBLAS_"):
            if v.startswith(prefix):
                return v[len(prefix):]
        return v

    m = property(lambda self: self._int("m"), doc="cuBLAS m (column-major), None if not a GEMM-like call")
    n = property(lambda self: self._int("n"))
    k = property(lambda self: self._int("k"))
    batch_count = property(lambda self: self._int("batchCount"))
    op_a = property(lambda self: op_letter(self.value("transa")))
    op_b = property(lambda self: op_letter(self.value("transb")))
    a_type = property(lambda self: self._type("Atype"))
    b_type = property(lambda self: self._type("Btype"))
    c_type = property(lambda self: self._type("Ctype"))
    compute_type = property(lambda self: self._type("computeType"))

    def to_dict(self) -> dict:
        """Flat dict: line, time, pid, function, version, file, ``arg_<name>`` and ``info_<name>``."""
        d = {"line": self.line, "time": self.time, "pid": self.pid, "function": self.function,
             "version": self.version, "file": self.file}
        for n, _, v in self.args:
            d[f"arg_{n}"] = v
        for n, v in self.info.items():
            d[f"info_{n}"] = v
        return d


def _add_info(call: CublasCall, s: str) -> bool:
    m = _INFO_PAIRS.match(s)
    if m is not None:  # "i!Process=600; Thread=...; GPU=0; Handle=POINTER (...); MathMode=..."
        for pair in m.group(1).split("; "):
            key, sep, value = pair.partition("=")
            if sep:
                call.info[key.strip()] = value
        pid = call.info.get("Process")
        if pid is not None and pid.isdigit():
            call.pid = int(pid)
        return True
    m = _INFO.match(s)
    if m is not None:  # "i! Time: 2026-11-30T04:31:21 elapsed from start ..."
        key, value = m.group(1).strip(), m.group(2)
        call.info[key] = value
        if key == "Time" and value:
            call.time = value.split()[0]
        return True
    return False


def parse_cublas_log(source: Source, *, stats: ParseStats | None = None,
                     name: str | None = None) -> Iterator[CublasCall]:
    """Stream the calls of a cuBLAS API log (path, ``.gz``, open file or iterable of lines)."""
    st = stats if stats is not None else ParseStats()
    src = name if name is not None else source_name(source)
    with open_lines(source) as lines:
        st.files_read.append(src if src is not None else "<lines>")
        lineno = 0
        cur: CublasCall | None = None
        try:
            for line in lines:
                lineno += 1
                s = line.rstrip("\r\n")
                if s.startswith("I!"):
                    m = _CALL.match(s)
                    if m is None:
                        st.add_bad(src, lineno, "damaged cuBLAS call header", s)
                        continue
                    if cur is not None:
                        st.records += 1
                        yield cur
                    sig = m.group(2).strip()
                    fm = _FUNC.search(sig)
                    func = fm.group(1) if fm else (sig.split()[-1] if sig.split() else sig)
                    cur = CublasCall(lineno, func, m.group(1), sig, file=src)
                elif s.startswith("i!"):
                    m = _ARG.match(s)
                    if m is not None and cur is not None:
                        cur.args.append(m.groups())
                        continue
                    if cur is not None and _add_info(cur, s):
                        continue
                    if cur is None:
                        st.add_bad(src, lineno, "cuBLAS argument line before any call header", s)
                    else:
                        st.add_bad(src, lineno, "damaged cuBLAS argument line", s)
                elif not s.strip() or _LT_LINE.match(s):
                    st.skipped += 1
                else:
                    st.add_bad(src, lineno, "not a cuBLAS log line", s)
            if cur is not None:
                st.records += 1
                yield cur
        except READ_ERRORS as e:
            raise LogReadError(f"cannot read {src or 'the log'} past line {lineno:,}: "
                               f"{describe_read_error(e)}") from e
        finally:
            st.lines += lineno
