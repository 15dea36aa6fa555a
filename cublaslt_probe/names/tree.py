"""Demangled C++ template signatures as a small tree, and a reader of mangled text a demangler refused.

    >>> t = parse("void cutlass::device_kernel<X<cute::tuple<cute::C<64>, cute::_128>, float>>(X::Params)")
    >>> t.name, t.args[0].name, static_ints(t.args[0].args[0])
    ('cutlass::device_kernel', 'X', (64, 128))

`parse` reads one signature: the function name, its template arguments (nested, each a `Node`), the text
after a closing ``>`` (``::GemmKernel``) kept as `Node.suffix`; return type and parameter list are dropped.
It tolerates what profilers print: nsys casts ``(int)128`` / ``(bool)1``, ``(anonymous namespace)``, a
truncated tail (``...`` / ``…``: the open nodes are closed and `Tree.truncated` is set).

`mangled_words` reads an Itanium-mangled name without demangling it: the source names (``17GroupProblemShape``
-> ``GroupProblemShape``) and integer literals (``Li128E`` -> ``128``) in order. It is what is left when
neither demangler understands a name (a profiler cut it short): enough to tell the family and some fields.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

# A C-style cast of an integral template argument, ``(int)3``, ``(bool)1``: read by `parse` and by
# `names.helpers` when it normalises a template argument.
CAST = re.compile(r"\((?:int|bool|unsigned int|unsigned|long|unsigned long|long long|char|short|"
                  r"unsigned char|signed char)\)\s*")
_INT_LIT = re.compile(r"^-?([0-9]+)(?:u|ul|l|ll|ull|U|UL|L)?$")
_STATIC = re.compile(r"^(?:cute::)?(?:C<\s*(-?[0-9]+)\s*>|_([0-9]+))$")


@dataclass
class Node:
    name: str
    args: list["Node"] = field(default_factory=list)
    suffix: str = ""

    @property
    def short(self) -> str:
        """The last ``::`` part of the name (``cutlass::gemm::KernelTmaWarpSpecialized`` -> ``Kernel...``)."""
        return self.name.rsplit("::", 1)[-1]

    def walk(self):
        yield self
        for a in self.args:
            yield from a.walk()

    def find(self, pred) -> "Node | None":
        for n in self.walk():
            if pred(n):
                return n
        return None

    def text(self) -> str:
        inner = ", ".join(a.text() for a in self.args)
        return f"{self.name}<{inner}>{self.suffix}" if self.args else self.name + self.suffix


@dataclass
class Tree:
    root: Node
    truncated: bool = False


def parse(sig: str) -> Tree:
    """The template tree of the first function in a demangled signature (never raises)."""
    s = CAST.sub("", sig)
    truncated = False
    for e in ("…", "..."):
        if s.rstrip().endswith(e):
            s, truncated = s.rstrip()[: -len(e)], True
    # drop a leading return type: the function name is the last space-separated word before '<' or '('
    depth = 0
    start = 0
    end = len(s)
    i = 0
    while i < len(s):
        ch = s[i]
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            if s.startswith("(anonymous namespace)", i):
                i += len("(anonymous namespace)")
                continue
            end = i
            break
        elif ch == " " and depth == 0:
            start = i + 1
        i += 1
    body = s[start:end]
    root = Node("")
    stack = [root]
    cur = root
    buf: list[str] = []
    after_close = False

    def flush():
        text = "".join(buf).strip()
        buf.clear()
        return text

    def end_item():
        """The text since the last bracket or comma: a suffix of the name just closed, or a leaf argument."""
        text = flush()
        if after_close:
            cur.suffix += text
        elif text:
            stack[-1].args.append(Node(text))

    for ch in body:
        if ch == "<":
            text = flush()
            if after_close:
                # X<a>::Y<b>: treat the whole as one name (rare); keep the inner args of the last part
                cur.suffix += text
                continue
            n = Node(text)
            stack[-1].args.append(n)
            stack.append(n)
            cur = n
            after_close = False
        elif ch == ",":
            end_item()
            after_close = False
        elif ch == ">":
            end_item()
            if len(stack) > 1:
                cur = stack.pop()
                after_close = True
        else:
            buf.append(ch)
    end_item()
    if len(stack) > 1:
        truncated = True
    top = root.args[0] if len(root.args) == 1 else Node(body.split("<", 1)[0].strip(), root.args)
    return Tree(top, truncated)


def int_value(n: Node) -> int | None:
    """An integer template argument (``128``, ``4096u``, ``cute::C<64>``, ``cute::_128``), else None."""
    if n.args:
        if n.short == "C" and len(n.args) == 1:
            return int_value(n.args[0])
        return None
    m = _INT_LIT.match(n.name.strip())
    if m:
        return int(n.name.strip().rstrip("uUlL"))
    m = _STATIC.match(n.name.strip())
    if m:
        return int(m.group(1) or m.group(2))
    return None


def static_ints(n: Node) -> tuple[int, ...] | None:
    """The values of a ``cute::tuple`` / ``cute::Shape`` / ``GemmShape`` of static integers, else None."""
    if not n.args or n.short not in ("tuple", "Shape", "GemmShape", "MatrixShape"):
        return None
    vals = tuple(int_value(a) for a in n.args)
    return None if any(v is None for v in vals) else vals


# ------------------------------------------------------------------------------------------ mangled
_LIT = re.compile(r"L[a-z](n?)([0-9]+)E")
_DIGITS = frozenset("0123456789")


def mangled_words(s: str) -> list[str | int]:
    """Source names and integer literals of an Itanium-mangled name, in order (never raises)."""
    out: list[str | int] = []
    i, n = 0, len(s)
    if s.startswith("_Z"):
        i = 2
    while i < n:
        ch = s[i]
        if ch == "L" and i + 1 < n and "a" <= s[i + 1] <= "z":
            m = _LIT.match(s, i)
            if m:
                v = int(m.group(2))
                out.append(-v if m.group(1) else v)
                i = m.end()
                continue
            i += 1
        elif ch == "S" or ch == "T":
            # substitution / template parameter: S<seq>_ or S_ or St/Sa/...; skip it
            j = i + 1
            while j < n and (s[j] in _DIGITS or "A" <= s[j] <= "Z"):
                j += 1
            i = j + 1 if j < n and s[j] == "_" else i + 1
        elif ch in _DIGITS:
            j = i
            while j < n and s[j] in _DIGITS:
                j += 1
            length = int(s[i:j])
            word = s[j:j + length]
            if length and len(word) == length and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", word):
                out.append(word)
                i = j + length
            else:
                i = j
        else:
            i += 1
    return out
