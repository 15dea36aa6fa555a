"""The small engine every family grammar is built from.

A grammar is a prefix, an ordered list of *slots* and a family. Decoding splits the bare name on ``_``
(gluing the family's multi-word phrases such as ``segment_k_off`` back together), then walks the tokens
left to right: each token goes to the first slot, at or after the current one, that accepts it; a token
no slot accepts is kept in ``unparsed``. Encoding asks each slot, in order, for the tokens it writes.
Because decode and encode read the same slots, and the slots read the token tables in `tokens.py`,
`cublaslt-probe grammars` and docs/decoder.md are generated from the same source.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable

from cublaslt_probe.names.model import KernelName
from cublaslt_probe.names.tokens import INFERRED, Meaning, Tok

Fields = dict  # field name -> value; "+flags" appends to KernelName.flags, "+<field>" to a tuple field


@dataclass(frozen=True)
class Slot:
    """One position of a grammar."""

    key: str
    template: str
    match: Callable[[str], Fields | None]
    render: Callable[[KernelName], list[str]]
    required: bool = False
    repeat: bool = False
    meanings: tuple[Meaning, ...] = ()


@dataclass
class Grammar:
    """A family's grammar: how its names are split, which slots they fill, how fields are derived."""

    name: str                                     # registry key (a family may have several grammars)
    family: str
    summary: str
    template: str
    examples: tuple[str, ...]
    slots: tuple[Slot, ...]
    phrases: tuple[tuple[str, ...], ...] = ()     # multi-token words glued back together after split
    finish: Callable[[Fields, list], None] | None = None  # derive fields from (fields, flags)
    owns: Callable[[KernelName], bool] | None = None  # which decoded names this grammar encodes
    notes: tuple[str, ...] = ()
    glue: tuple[str, ...] = ()                    # regexes: a token matching one is glued to the next
    _heads: dict = field(default_factory=dict, repr=False)
    _glue: tuple = field(default=(), repr=False)

    def __post_init__(self):
        heads: dict[str, list[tuple[str, ...]]] = {}
        for p in sorted(self.phrases, key=len, reverse=True):
            heads.setdefault(p[0], []).append(p)
        self._heads = heads
        self._glue = tuple(re.compile(g) for g in self.glue)

    # ----------------------------------------------------------------------------------- decode
    def split(self, base: str) -> list[str]:
        toks = base.split("_")
        if self._glue:
            out = []
            i = 0
            while i < len(toks):
                if i + 1 < len(toks) and any(g.fullmatch(toks[i]) for g in self._glue):
                    out.append(toks[i] + "_" + toks[i + 1])
                    i += 2
                else:
                    out.append(toks[i])
                    i += 1
            toks = out
        if not self._heads:
            return toks
        out, i, n = [], 0, len(toks)
        heads = self._heads
        while i < n:
            t = toks[i]
            cands = heads.get(t)
            if cands:
                for p in cands:
                    k = len(p)
                    if tuple(toks[i:i + k]) == p:
                        out.append("_".join(p))
                        i += k
                        break
                else:
                    out.append(t)
                    i += 1
            else:
                out.append(t)
                i += 1
        return out

    def parse(self, tokens: list[str]) -> tuple[Fields, list[str], list[str]]:
        """Walk the tokens through the slots: (fields, flags, unparsed)."""
        fields: Fields = {}
        flags: list[str] = []
        unparsed: list[str] = []
        filled = set()
        slots = self.slots
        n = len(slots)
        si = 0
        for tok in tokens:
            j = si
            while j < n:
                s = slots[j]
                upd = s.match(tok)
                if upd is not None:
                    for k, v in upd.items():
                        if k == "+flags":
                            flags.append(v)
                        elif k == "+unparsed":
                            unparsed.append(v)
                        elif k[0] == "+":     # "+<field>": append to a tuple field (fused_ops)
                            fields[k[1:]] = fields.get(k[1:], ()) + (v,)
                        else:
                            fields[k] = v
                    filled.add(s.key)
                    si = j if s.repeat else j + 1
                    break
                j += 1
            else:
                unparsed.append(tok)
        for s in slots:
            if s.required and s.key not in filled:
                unparsed.append(f"<missing {s.key}>")
        return fields, flags, unparsed

    # ----------------------------------------------------------------------------------- encode
    def encode(self, kn: KernelName) -> str:
        out: list[str] = []
        for s in self.slots:
            toks = s.render(kn)
            if s.required and not toks:
                raise ValueError(f"cannot encode a {self.family} name: {s.key} ({s.template}) is not set "
                                 f"in {kn.base or kn.name!r}")
            out.extend(toks)
        return "_".join(out)

    # ------------------------------------------------------------------------------------- docs
    def meanings(self) -> list[Meaning]:
        rows: list[Meaning] = []
        for s in self.slots:
            rows.extend(s.meanings)
        return rows

    def to_dict(self) -> dict:
        return {"grammar": self.name, "family": self.family, "summary": self.summary,
                "template": self.template, "examples": list(self.examples),
                "notes": list(self.notes), "tokens": [m.to_dict() for m in self.meanings()]}


# --------------------------------------------------------------------------------- slot builders
def literal(key: str, word: str, meaning: str, *, required: bool = True, when=None,
            evidence: str = INFERRED, source: str = "", sets: Fields | None = None) -> Slot:
    """A fixed word. Optional literals are written when ``when(kn)`` is true."""
    upd = dict(sets or {})

    def match(tok):
        return upd if tok == word else None

    def render(kn):
        if required or (when is not None and when(kn)):
            return [word]
        return []

    return Slot(key, word, match, render, required=required,
                meanings=(Meaning(word, ", ".join(upd) or "-", meaning, evidence, source),))


def table(key: str, template: str, mapping: dict[str, Tok], fld: str, *, required: bool = False) -> Slot:
    """One token from a table; sets ``fld`` to the token's value. Encodes by reverse lookup."""
    reverse = {}
    for tok, t in mapping.items():
        reverse.setdefault(t.value, tok)

    def match(tok):
        t = mapping.get(tok)
        return None if t is None else {fld: t.value}

    def render(kn):
        v = getattr(kn, fld)
        if v is None:
            return []
        tok = reverse.get(v)
        return [tok] if tok is not None else []

    return Slot(key, template, match, render, required=required,
                meanings=tuple(Meaning(tok, fld, t.meaning, t.evidence, t.source)
                               for tok, t in mapping.items()))


def flag_set(key: str, template: str, mapping: dict[str, Tok], *, patterns: tuple = ()) -> Slot:
    """Zero or more flags from a table (or matching ``patterns``: (regex, Meaning)); kept in order."""
    compiled = tuple((re.compile(p), m) for p, m in patterns)

    def mine(tok):
        return tok in mapping or any(rx.fullmatch(tok) for rx, _ in compiled)

    def match(tok):
        return {"+flags": tok} if mine(tok) else None

    def render(kn):
        return [f for f in kn.flags if mine(f)]

    rows = tuple(Meaning(tok, "flags", t.meaning, t.evidence, t.source) for tok, t in mapping.items())
    rows += tuple(m for _, m in compiled)
    return Slot(key, template, match, render, repeat=True, meanings=rows)


def regex(key: str, template: str, pattern: str, parse: Callable[[re.Match], Fields | None],
          render: Callable[[KernelName], str | list[str] | None], meanings: tuple[Meaning, ...], *,
          required: bool = False, repeat: bool = False) -> Slot:
    """A token of a given shape, e.g. ``^(\\d+)x(\\d+)$``."""
    rx = re.compile(pattern)

    def match(tok):
        m = rx.fullmatch(tok)
        if m is None:
            return None
        try:
            return parse(m)
        except ValueError:  # e.g. a size of more digits than int() converts: a token no rule understands
            return None

    def _render(kn):
        r = render(kn)
        if r is None:
            return []
        return [r] if isinstance(r, str) else list(r)

    return Slot(key, template, match, _render, required=required, repeat=repeat, meanings=meanings)


def pair(a: str, b: str) -> Callable[[KernelName], str | None]:
    """Render ``<a>x<b>`` when both fields are set."""
    def render(kn):
        x, y = getattr(kn, a), getattr(kn, b)
        return None if x is None or y is None else f"{x}x{y}"
    return render


def triple(a: str, b: str, c: str, prefix: str = "") -> Callable[[KernelName], str | None]:
    def render(kn):
        x, y, z = getattr(kn, a), getattr(kn, b), getattr(kn, c)
        return None if x is None or y is None or z is None else f"{prefix}{x}x{y}x{z}"
    return render


def shape(fld: str, prefix: str = "") -> Callable[[KernelName], str | None]:
    def render(kn):
        v = getattr(kn, fld)
        return None if v is None else prefix + "x".join(str(i) for i in v)
    return render


# ------------------------------------------------------------------------------------ registry
GRAMMARS: dict[str, Grammar] = {}


def register(g: Grammar) -> Grammar:
    if g.name in GRAMMARS:
        raise ValueError(f"grammar {g.name!r} registered twice")
    GRAMMARS[g.name] = g
    return g


def grammar_for(kn: KernelName) -> Grammar | None:
    """The grammar that encodes this decoded name (by family, then `owns`)."""
    for g in GRAMMARS.values():
        if g.family == kn.family and (g.owns is None or g.owns(kn)):
            return g
    return None
