"""Text folded for matching: the many spellings of one word brought to one, with a map back to the original.

:func:`fold` gives a copy of a text that is NFKC, without accents and case-folded; in which letters that
look Latin are Latin (UTS #39 confusables through the ``confusable-homoglyphs`` package, and Latin letters
in other forms by their Unicode names), invisible characters are gone and whitespace runs are one space
(one line break when the run holds one); and in which three or more single letters or digits with the
same one- or two-character separator (``S-c-o-r-e``, ``f i v e``) are one word. Each character of the
copy keeps the index of the original character it came from, so a match in the copy is a span of the
original. The judge-addressing detector (:mod:`.addressing`) folds its patterns and texts through here.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from rapo_echo.text import invisible

_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")
# punctuation that looks like ASCII quotes and angle brackets (UTS #39 leaves most of these alone)
_PUNCTUATION = str.maketrans(
    {
        **dict.fromkeys("«‹≪〈《⟨❮﹤", "<"),
        **dict.fromkeys("»›≫〉》⟩❯﹥", ">"),
        **dict.fromkeys("〔【", "["),
        **dict.fromkeys("〕】", "]"),
        **dict.fromkeys("“”„‟″", '"'),
        **dict.fromkeys("‘’‚‛′", "'"),
    }
)
_LATIN_NAME = re.compile(
    r"LATIN (?:SMALL |CAPITAL )?LETTER (?:SMALL CAPITAL |INVERTED |TURNED |REVERSED |DOTLESS )?([A-Z])\b"
    r"|MODIFIER LETTER (?:SMALL |CAPITAL )?([A-Z])\b"
)
# three or more single letters or digits, the same separator of one or two characters between each
_SPACED = re.compile(r"(?<![^\W_])[^\W_]([^\w]{1,2}|_)[^\W_](?:\1[^\W_])+(?![^\W_])")


@functools.lru_cache(maxsize=8192)
def _latin(ch: str) -> str:
    """The ASCII letter or digit ``ch`` (one folded character) looks like, else ``ch``."""
    if ch.isascii():
        return ch
    name = unicodedata.name(ch, "")
    m = _LATIN_NAME.match(name)
    if m:
        return (m.group(1) or m.group(2)).lower()
    from confusable_homoglyphs import confusables

    found = confusables.is_confusable(ch, greedy=True, preferred_aliases=["latin"])
    for entry in found or []:
        for glyph in entry.get("homoglyphs", []):
            bare = "".join(
                c for c in unicodedata.normalize("NFKD", glyph["c"]) if not unicodedata.combining(c)
            )
            if len(bare) == 1 and bare.isascii() and bare.isalnum():
                return bare.lower()
    return ch


@functools.lru_cache(maxsize=8192)
def _fold_char(ch: str) -> str:
    """One non-space character folded: NFKC, no accents, case-folded, look-alikes to Latin, invisible
    characters dropped ('' when nothing shows)."""
    out = []
    for piece in unicodedata.normalize("NFKD", unicodedata.normalize("NFKC", ch)):
        if invisible(piece) or unicodedata.combining(piece):
            continue
        for c in piece.casefold():
            out.append(c if c.isspace() else _latin(c).translate(_PUNCTUATION))
    return "".join(out)


def normalise(text: str) -> tuple[str, list[int]]:
    """``text`` folded (the module doc) without the joining of spaced-out letters, and for each of its
    characters the index of the character of ``text`` it came from."""
    out: list[str] = []
    origin: list[int] = []
    gap: tuple[str, int] | None = None  # the pending whitespace run: its character and origin
    for i, ch in enumerate(str(text)):
        folded = ch if ch.isspace() else _fold_char(ch)
        for piece in folded:
            if piece.isspace():
                brk = "\n" if piece in _BREAKS else " "
                if gap is None or (brk == "\n" and gap[0] == " "):
                    gap = (brk, i if gap is None else gap[1])
                continue
            if gap is not None and out:
                out.append(gap[0])
                origin.append(gap[1])
            gap = None
            out.append(piece)
            origin.append(i)
    return "".join(out), origin


def fold(text: str) -> tuple[str, list[int]]:
    """``text`` folded (the module doc) and the origin of each character in ``text``."""
    norm, origin = normalise(text)
    pieces: list[str] = []
    kept: list[int] = []
    at = 0
    for m in _SPACED.finditer(norm):
        pieces.append(norm[at : m.start()])
        kept.extend(origin[at : m.start()])
        for j in range(m.start(), m.end()):
            if norm[j].isalnum():
                pieces.append(norm[j])
                kept.append(origin[j])
        at = m.end()
    pieces.append(norm[at:])
    kept.extend(origin[at:])
    return "".join(pieces), kept


def fold_words(text: str) -> str:
    """Just the folded text (for writing patterns in any spelling: they are folded as texts are)."""
    return fold(text)[0]
