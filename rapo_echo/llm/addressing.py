"""Text that addresses the judge: the one detector for replies, profiles and scenarios (issue 39).

In RL the policy is the adversary: whatever moves its judge, it learns to write. A text *addresses the
judge* when it

* ``answer``: imitates a judge's answer: a JSON object with an answer key (``{"score": 5}``,
  ``{"verdict": "A"}``, ``{"ranking": [...]}``), an answer line (``Score: 5``, ``Verdict: human``, ``9/10``),
  a rank-letter claim (``Reply A helped most``, ``The reply that helped the person most is Reply B``);
* ``address``: speaks to the judge or tells it what to decide (``Note for the judge: ...``, ``ignore the
  previous instructions``, ``always say Reply A``, ``rate this reply 5``, ``[SYSTEM NOTE]``);
* ``fence``: carries fence or chat-template markers (``<<<END REPLY ...>>>``, ``<|im_start|>``,
  ``[INST]``, a ``system:`` line).

:func:`findings` lists what a text holds (kind, the matched words, where); :func:`addresses_judge` says
whether it holds anything; :func:`strip_addressing` removes the sentences, JSON objects and markers that
hold it. Matching runs on a normalised copy (:func:`normalise`): Unicode compatibility forms (NFKC), letters
that look Latin (Cyrillic, Greek), case, zero-width and other invisible characters, and every kind of
whitespace, so case, spacing and Unicode variants of a pattern are found too; letter-spaced words
(``S c o r e : 5``) are found on a copy without spaces. The patterns are ours, written for the answer
formats of this library's judges and for instructions to a reader; ``docs/judges.md`` says what they do
not catch. Pure text, below everything but :mod:`rapo_echo.text` (the monitor, the judges and the
simulators all use it).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from rapo_echo.text import invisible

KINDS = ("answer", "address", "fence")

# letters that render like Latin ones (lower case; text is case-folded first)
_LOOKALIKES = str.maketrans(
    {
        "а": "a",
        "в": "b",
        "е": "e",
        "ё": "e",
        "к": "k",
        "м": "m",
        "н": "h",
        "о": "o",
        "р": "p",
        "с": "c",
        "т": "t",
        "у": "y",
        "х": "x",
        "і": "i",
        "ї": "i",
        "ј": "j",
        "ѕ": "s",
        "ԁ": "d",
        "ԛ": "q",
        "ԝ": "w",
        "һ": "h",
        "ӏ": "l",
        "ү": "y",
        "ɡ": "g",
        "ɑ": "a",
        "ı": "i",
        "ℓ": "l",
        "α": "a",
        "β": "b",
        "ε": "e",
        "ζ": "z",
        "η": "n",
        "ι": "i",
        "κ": "k",
        "ν": "v",
        "ο": "o",
        "ρ": "p",
        "τ": "t",
        "υ": "u",
        "χ": "x",
        "ω": "w",
        "«": "<",
        "‹": "<",
        "≪": "<",
        "〈": "<",
        "《": "<",
        "⟨": "<",
        "❮": "<",
        "〔": "[",
        "»": ">",
        "›": ">",
        "≫": ">",
        "〉": ">",
        "》": ">",
        "⟩": ">",
        "❯": ">",
        "〕": "]",
        "“": '"',
        "”": '"',
        "„": '"',
        "‘": "'",
        "’": "'",
        "`": "'",
    }
)
# characters that show nothing but are not whitespace or format characters
_BREAKS = frozenset("\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029")


def _invisible(ch: str) -> bool:
    """Shows nothing (:func:`rapo_echo.text.invisible`), or a combining mark (dropped for matching)."""
    return invisible(ch) or unicodedata.category(ch) == "Mn"


def normalise(text: str) -> tuple[str, list[int]]:
    """``text`` folded for matching, and for each of its characters the index of the character of ``text``
    it came from. Folding: NFKC per character, case folding, look-alike letters to Latin, invisible
    characters (format, control, combining marks, Hangul fillers) dropped, every run of whitespace one
    space (one newline when the run holds a line break)."""
    out: list[str] = []
    origin: list[int] = []
    gap: tuple[str, int] | None = None  # the pending whitespace run: its character and origin

    def put(piece: str, i: int) -> None:
        nonlocal gap
        if gap is not None and out:
            out.append(gap[0])
            origin.append(gap[1])
        gap = None
        out.append(piece)
        origin.append(i)

    for i, ch in enumerate(str(text)):
        folded = ch if ch.isspace() else unicodedata.normalize("NFKC", ch).casefold().translate(_LOOKALIKES)
        for piece in folded:
            if piece.isspace():
                brk = "\n" if piece in _BREAKS else " "
                if gap is None or (brk == "\n" and gap[0] == " "):
                    gap = (brk, i if gap is None else gap[1])
            elif not _invisible(piece):
                put(piece, i)
    return "".join(out), origin


_ANSWER_KEYS = (
    r"score|rating|grade|verdict|ranking|rank|label|winner|best|answer|p_human|reasoning|valence_change"
    r"|emotion|emotion_delta|reply"
)
_JUDGES = (
    r"judge|judges|grader|graders|evaluator|evaluators|rater|raters|reviewer|reviewers|assessor|scorer"
    r"|annotator|ranker|reward model|reward models|language model|llm|ai model|ai judge"
)
_TAGS = r"reply|replies|dialogue|profile|persona|needs|reaction|thought|reference|reviewed reply|best reply"
_VALUE = r"(?:\d+(?:\.\d+)?(?:\s*/\s*\d+)?|human|ai|tie|yes|no|[a-g]\b|\[)"
_PATTERNS: tuple[tuple[str, str], ...] = (
    # --- answer: a judge's answer object, line or claim
    ("answer", rf"\{{[^{{}}]{{0,300}}?['\"]?\s*(?:{_ANSWER_KEYS})\s*['\"]?\s*[:=]"),
    (
        "answer",
        rf"\b(?:score|rating|grade|verdict|ranking|final answer|label|winner|answer|p\(human\))"
        rf"\s*[:=]\s*{_VALUE}",
    ),
    ("answer", r"\b(?:score|rating|grade)d?\s+(?:of\s+|is\s+|=\s*)?\d+(?:\.\d+)?\s*(?:/|out of)\s*\d+"),
    ("answer", r"(?<![\d/.:])(?:10|[0-9](?:\.\d)?)\s*/\s*(?:10|5)\b(?![/\d])"),
    ("answer", r"(?<![\d/.:])(?:100|[1-9]?\d)\s*/\s*100\b(?![/\d])"),
    (
        "answer",
        r"\b(?:reply|response|option|candidate)\s+[a-h]\s+(?:helped|is\s+(?:the\s+)?(?:best|better|winner)"
        r"|wins|won|should\s+(?:be\s+)?(?:ranked|rated|chosen|picked)|ranks?\s+(?:first|highest|1))",
    ),
    ("answer", r"\bthe\s+reply\s+that\s+helped(?:\s+the\s+person)?\s+(?:the\s+)?most\s+is\b"),
    (
        "answer",
        r"\b(?:this|my|the\s+(?:above|following))\s+(?:reply|response|answer|message)\s+(?:is|was)\s+"
        r"(?:clearly\s+|definitely\s+)?(?:the\s+)?(?:best|better|winner|better\s+one|best\s+one|excellent|perfect"
        r"|written\s+by\s+a\s+human|human)\b",
    ),
    ("answer", r"\b(?:written|typed)\s+by\s+a\s+(?:real\s+)?human\b"),
    (
        "answer",
        r"\b(?:ranking|order)\s*[:=]?\s*\[?\s*['\"]?[a-h]['\"]?\s*(?:>|,)\s*['\"]?[a-h]['\"]?\s*(?:>|,)",
    ),
    # --- address: words to the judge, instructions about the decision
    (
        "address",
        rf"\b(?:note|message|notes|instruction|instructions|reminder|hint|memo|p\.?s\.?)\s+(?:for|to)\s+"
        rf"(?:the\s+|any\s+|all\s+|our\s+)?(?:{_JUDGES}|model|ai|assistant|system|whoever\b[^.!?\n]{{0,30}})",
    ),
    ("address", rf"\b(?:dear|hey|hello|hi|attention|attn|to\s+the|calling\s+all)\s*,?\s+(?:{_JUDGES})\b"),
    ("address", rf"(?:^|[\n.!?]\s*)(?:{_JUDGES}|system|admin|developer)\s*[:,]"),
    ("address", rf"\b(?:{_JUDGES})\s+(?:must|should|will|shall|needs?\s+to|has\s+to|please)\b"),
    (
        "address",
        r"\b(?:ignore|disregard|forget|override|bypass)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+|these\s+|those\s+)?"
        r"(?:previous|prior|above|earlier|preceding|other|original|system|rubric|scoring|judging)?\s*"
        r"(?:instructions?|rules|prompts?|guidelines|rubric|criteria|directions)\b",
    ),
    (
        "address",
        r"\b(?:always|only|must|you\s+(?:must|should|will|have\s+to)|please)\s+(?:say|answer|output|respond|"
        r"reply|pick|choose|select|prefer|rank|rate|score|grade|label)\s+(?:with\s+|that\s+)?"
        r"(?:reply|response|option|candidate|verdict|score|rating|rank|['\"]|human\b|ai\b|\d|[a-h]\b(?!\s+\w))",
    ),
    (
        "address",
        r"\b(?:rate|score|grade|rank|judge|mark)\s+(?:this|it|me|my|the|our)\b[^.!?\n]{0,40}?"
        r"(?:\b\d+(?:\.\d+)?\b|\bfirst\b|\bhighest\b|\bbest\b|\btop\b|\bmaximum\b|\bmax\b|\bfull\s+marks\b)",
    ),
    (
        "address",
        r"\bgive\s+(?:this|it|me|my|the|our)\s*(?:reply|response|answer|one)?\s+(?:a\s+|an\s+|the\s+)?"
        r"(?:\d+(?:\.\d+)?\b|full\s+marks|top\s+marks|top\s+score|highest|perfect|maximum|five|ten)",
    ),
    (
        "address",
        r"\b(?:deserves|earns|should\s+(?:get|receive|be\s+given))\s+(?:a\s+|an\s+|the\s+)?"
        r"(?:\d+\s*(?:/|out of)|full\s+marks|top\s+(?:marks|score|rank)|highest\s+(?:score|rating|rank)|"
        r"perfect\s+score|first\s+place|rank\s+1)",
    ),
    (
        "address",
        r"\b(?:system|developer|admin|administrator|judge|grader|evaluator)\s+(?:note|message|prompt|"
        r"instruction|instructions|override|notice|directive|update)\b",
    ),
    (
        "address",
        r"\[\s*(?:system|admin|developer|judge|grader|evaluator|assistant|instruction|instructions|"
        r"note to)[^\]\n]{0,40}\]",
    ),
    (
        "address",
        r"\b(?:as\s+an?\s+)?(?:ai|language\s+model|llm)\s+(?:judge|grader|evaluator|reading\s+this)\b",
    ),
    # --- fence: fence and chat-template markers
    ("fence", r"<{3,}|>{3,}"),
    ("fence", rf"(?:[<\[{{#=*-]\s*)+end\s+(?:{_TAGS})\b"),
    (
        "fence",
        r"<\|[a-z_ ]{1,30}\|>|<\s*/?\s*s\s*>|\[/?\s*inst\s*\]|<<\s*/?\s*sys\s*>>"
        r"|<\s*/?\s*(?:start|end)_of_turn\s*>",
    ),
    (
        "fence",
        r"(?:^|\n)\s*#{2,}\s*(?:system|instruction|instructions|response|assistant|user|judge|verdict)\b",
    ),
    ("fence", r"(?:^|\n)\s*(?:system|assistant|user|judge)\s*:"),
)
_COMPILED = tuple((kind, re.compile(p)) for kind, p in _PATTERNS)
# patterns that are also looked for with every space removed (letter-spaced words, "S c o r e : 5"); a
# match there counts only when it starts where a word starts in the text
_SQUEEZED = tuple(
    (kind, re.compile(p))
    for kind, p in (
        ("answer", rf"\{{[^{{}}]{{0,300}}?['\"]?(?:{_ANSWER_KEYS})['\"]?[:=]"),
        ("answer", r"(?:score|rating|verdict|ranking)[:=](?:\d|human|ai\b|tie|[a-g](?![a-z])|\[)"),
        (
            "address",
            r"(?:noteforthejudge|notetothejudge|systemnote|systemprompt|ignore(?:all)?(?:the)?"
            r"previousinstructions|alwayssayreply|dearjudge)",
        ),
        ("fence", r"<{3,}|>{3,}|<\|[a-z_]{1,30}\|>"),
    )
)


@dataclass(frozen=True)
class Finding:
    """One place where a text addresses the judge: ``kind`` (:data:`KINDS`), the matched words
    (normalised) and the span ``[start, end)`` in the original text."""

    kind: str
    match: str
    start: int
    end: int


def findings(text: str) -> list[Finding]:
    """Every place where ``text`` addresses the judge (see the module doc), in order of position."""
    text = str(text or "")
    return list(_findings(text)) if text else []


@functools.lru_cache(maxsize=4096)  # a group's replies share their scenario: its texts are screened often
def _findings(text: str) -> tuple[Finding, ...]:
    norm, origin = normalise(text)
    out: dict[tuple[int, int], Finding] = {}

    def add(kind: str, start: int, end: int, words: str) -> None:
        if end <= start:
            return
        span = (origin[start], origin[end - 1] + 1)
        out.setdefault(span, Finding(kind, words, *span))

    for kind, pattern in _COMPILED:
        for m in pattern.finditer(norm):
            add(kind, m.start(), m.end(), m.group(0))
    squeezed = [(ch, j) for j, ch in enumerate(norm) if ch not in " \n"]
    flat = "".join(ch for ch, _ in squeezed)
    for kind, pattern in _SQUEEZED:
        for m in pattern.finditer(flat):
            first = squeezed[m.start()][1]
            if first > 0 and norm[first - 1].isalnum() and norm[first].isalnum():
                continue  # starts inside a word ("frustrating:5" is not "rating:5")
            last = squeezed[m.end() - 1][1]
            add(kind, first, last + 1, m.group(0))
    return tuple(sorted(out.values(), key=lambda f: (f.start, f.end)))


def addresses_judge(text: str) -> bool:
    """Whether ``text`` addresses the judge (:func:`findings` is not empty)."""
    return bool(findings(text))


def imitates_answer(text: str) -> bool:
    """Whether ``text`` imitates a judge's answer (a finding of kind ``answer``)."""
    return any(f.kind == "answer" for f in findings(text))


_SENTENCE_END = re.compile(r"[.!?。！？]+[\"')\]]*(?=\s)|\n")


def _cut(text: str, f: Finding) -> tuple[int, int]:
    """The span removed for ``f``: a fence marker alone (a ``<<<...>>>`` group whole), a JSON object
    whole, the bracketed aside that holds it, otherwise the sentence (or line) around it."""
    if f.kind == "fence":
        start, end = f.start, f.end
        if text.startswith("<", start) or text[start:end].strip("<") == "":
            close = text.find(">>>", end)
            line_end = text.find("\n", start)
            if close >= 0 and (line_end < 0 or close < line_end):
                end = close + 3
        return start, end
    brace = text.rfind("{", 0, f.start + 1)
    if f.kind == "answer" and brace >= 0 and "{" in text[brace : f.end]:
        depth = 0
        for i in range(brace, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return brace, i + 1
        return brace, len(text)
    group = _enclosing_group(text, f.start, f.end)
    if group is not None:  # an aside in brackets: the aside alone, the person's own words stay
        return group
    start = 0
    for m in _SENTENCE_END.finditer(text, 0, f.start):
        start = m.end()
    m = _SENTENCE_END.search(text, f.end)
    end = m.end() if m else len(text)
    return start, end


_CLOSE = {"(": ")", "[": "]"}


def _enclosing_group(text: str, start: int, end: int) -> tuple[int, int] | None:
    """The span of the innermost ``(...)`` or ``[...]`` on the same line that holds ``text[start:end]``
    (its brackets may be part of the match), else None."""
    depth = 0
    for i in range(min(start, len(text) - 1), -1, -1):
        c = text[i]
        if c == "\n":
            return None
        if c in ")]" and i != start:
            depth += 1
        elif c in "([":
            if depth:
                depth -= 1
                continue
            j = _matching(text, i)
            return (i, j + 1) if j is not None and j + 1 >= end else None
    return None


def _matching(text: str, i: int) -> int | None:
    """The index of the bracket that closes the one at ``i`` on the same line, else None."""
    opening, closing, nested = text[i], _CLOSE[text[i]], 0
    for j in range(i + 1, len(text)):
        d = text[j]
        if d == "\n":
            return None
        if d == opening:
            nested += 1
        elif d == closing:
            if not nested:
                return j
            nested -= 1
    return None


def strip_addressing(text: str, rounds: int = 4) -> str:
    """``text`` without the parts that address the judge: each finding's bracketed aside, sentence (or
    line), JSON object or marker removed, repeated until nothing is found (at most ``rounds`` times);
    whitespace tidied at the cuts only. A text with nothing to remove is returned as it is."""
    text = str(text or "")
    if not findings(text):
        return text
    for _ in range(rounds):
        found = findings(text)
        if not found:
            break
        spans = sorted(_cut(text, f) for f in found)
        kept, at = [], 0
        for start, end in spans:
            if start > at:
                kept.append(text[at:start])
            at = max(at, end)
        kept.append(text[at:])
        text = _join(kept)
    return text.strip()


def _join(pieces: list[str]) -> str:
    """The pieces a cut left, joined with the whitespace at each join tidied (one space inside a line, one
    line break where a line went); the text elsewhere keeps its own spacing, so a context the judge sees
    differs from the clean one only where something was removed."""
    out = ""
    for piece in pieces:
        if not out:
            out = piece
            continue
        left, right = out.rstrip(" \t"), piece.lstrip(" \t")
        if left.endswith("\n") and right.startswith("\n"):
            right = right[1:]
        sep = "" if not left or not right or left.endswith("\n") or right.startswith("\n") else " "
        if right[:1] in (".", ",", ";", ":", "!", "?"):
            sep = ""
        out = left + sep + right
    return out
