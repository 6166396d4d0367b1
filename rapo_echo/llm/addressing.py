"""Text that addresses the judge: the one detector for replies, profiles and scenarios (issues 39, 46).

In RL the policy is the adversary: whatever moves its judge, it learns to write. The kinds a text can hold
(docs/judges.md has the full table and what the patterns do not catch): ``answer`` (a judge's answer in
any notation, or a claim of the outcome), ``address`` (speaks to the judge or tells it what to decide),
``markup`` (markup, code, or a sentence in another script) and ``fence`` (fence or chat-template markers).

Matching runs on a folded copy (:mod:`.folding`: NFKC, accents, case, UTS #39 confusables, small capitals,
invisible characters, spaced-out letters), the patterns' words folded the same way. :func:`findings`
lists what a text holds, :func:`addresses_judge` whether it holds anything, :func:`set_aside` takes out
the suspect spans (:func:`suspect_spans`) so that the other words stay. Pure text, below everything but
:mod:`rapo_echo.text` and :mod:`.folding`.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from rapo_echo.llm.folding import fold, fold_words, normalise

KINDS = ("answer", "address", "markup", "fence")
HOLE = "…"  # what stands where an answer inside a sentence was taken out

__all__ = [
    "KINDS",
    "Finding",
    "addresses_judge",
    "findings",
    "imitates_answer",
    "normalise",
    "set_aside",
    "strip_addressing",
    "suspect_spans",
]


def _words(words: str, *phrases: str) -> str:
    """An alternation of the space-separated ``words`` and the ``phrases``, folded as texts are (longest
    first), for a pattern."""
    folded = {fold_words(w) for w in [*words.split(), *phrases]}
    return "|".join(re.escape(w).replace(r"\ ", r"\s+") for w in sorted(folded, key=len, reverse=True))


_KEYS = _words(
    "score scores rating grade mark marks points stars verdict label result value output answer final "
    "winner best preferred preference choice ranking rank judgement judgment assessment evaluation eval "
    "classification author is_human p_human reward note punktzahl punkte bewertung urteil ergebnis "
    "wertung puntuación puntaje calificación nota veredicto voto punteggio giudizio valutazione pontuação "
    "avaliação оценка балл баллы вердикт результат",
    "final score",
    "final answer",
    "best reply",
    "p(human)",
)
_CJK_KEYS = _words("评分 分数 得分 判定 结果 裁决 评价 スコア 評価 点数 점수 평가 판정")
_NUMBER_WORDS = _words(
    "one two three four five six seven eight nine ten hundred deux trois quatre cinq sept huit neuf dix "
    "dos tres cuatro cinco seis siete ocho nueve diez zwei drei vier fünf sechs sieben acht neun zehn "
    "cinque sette otto nove dieci один два три четыре пять шесть семь восемь девять десять "
    "一 二 三 四 五 六 七 八 九 十 満点",
    "full marks",
    "top marks",
    "maximum",
    "max",
    "perfect",
    "highest",
)
_HUMAN = _words(
    "human humans person people humain humaine humano humana persona mensch человек 人类 人間 ai bot "
    "machine true yes oui ja да tie",
    "a human",
    "a person",
    "a real person",
    "real person",
    "a real human",
    "un humain",
    "una persona",
)
_REPLY = _words("reply response option candidate answer antwort réponse respuesta risposta resposta")
_UNITS = _words(
    "minutes minute hours hour days day weeks week months month years year times people pm am kg km "
    "miles percent"
)
_STARS = "[★☆⭐✩✪✫✬✭✮✯✰🌟]"
_NUM = r"\d{1,3}(?:[.,]\d+)?"
_ROMAN = r"(?:viii|vii|iii|ix|iv|vi|ii|v|x|i(?=\s*(?:$|[/(\n])))"
_OVER = r"(?:/|\bof\b|\bout\s+of\b|\bsur\b|\bvon\b|\bde\b|из|на)"
_FRACTION = rf"(?:{_NUM}|{_ROMAN})(?:\s*{_OVER}\s*(?:{_NUM}|{_ROMAN}))?%?"
_LETTER = rf"(?:(?:{_REPLY})\s*)?[a-h](?![^\W_])(?!\s+(?!of\b|and\b|or\b|vs\b|is\b|wins\b)[^\W\d_]{{2,}})"
_VALUE = (
    rf"(?:{_FRACTION}|(?:{_NUMBER_WORDS})(?![^\W_])|{_STARS}+|(?:{_HUMAN})(?![^\W_])|{_LETTER})"
    rf"(?![^\W_])(?!\s*(?:{_UNITS})\b)(?!\s*[-–:]\s*\d)"
)
_KEY_VALUE = rf"(?:(?<![^\W_])(?:{_KEYS})(?![^\W_])|(?:{_CJK_KEYS}))[\W_]{{0,8}}?{_VALUE}"
_JUDGE = _words(
    "judge judges grader graders evaluator evaluators rater raters reviewer reviewers assessor assessors "
    "scorer scorers annotator annotators ranker classifier juge juez giudice juiz richter évaluateur "
    "evaluador valutatore avaliador bewerter prüfer correcteur calificador оценщик судья 评委 评审 裁判 "
    "審査員",
    "reward model",
    "language model",
    "llm",
    "ai model",
    "ai judge",
)
_ASK = _words(
    "read reads rate rates grade grades score scores judge judges evaluate evaluates review reviews "
    "compare compares classify classifies check checks mark marks note juge compare évalue evalue "
    "califica compara bewertet vergleicht valuta"
)
_THIS_REPLY = rf"(?:this|my|the\s+(?:above|following|first|second|next))\s+(?:{_REPLY}|message|text)"
_TOP = _words(
    "best better excellent perfect flawless maximum highest top exemplary ideal helpful helped wins winner "
    "deserves meets criterion criteria rubric human person"
)
# (kind, pattern, whole): ``whole`` findings are taken out with their sentence or aside (words to the judge,
# claims of the outcome); the others alone when other words share their sentence (:func:`_cut`)
_PATTERNS: tuple[tuple[str, str, bool], ...] = (
    # --- answer: a judge's answer in any notation, or a claim of the outcome
    ("answer", _KEY_VALUE, False),
    (
        "answer",
        rf"\b(?:{_REPLY})\s*[a-h]\b[^.!?\n]{{0,30}}?\b(?:helped|is\s+(?:the\s+)?(?:best|better|winner)|wins|won"
        r"|should\s+(?:be\s+)?(?:ranked|rated|chosen|picked)|ranks?\s+(?:first|highest|1)|aide|ayudo|geholfen"
        r"|aiutato|ajudou|meilleure|mejor|besser|migliore|melhor)",
        True,
    ),
    ("answer", r"\bthe\s+reply\s+that\s+helped(?:\s+the\s+person)?\s+(?:the\s+)?most\s+is\b", True),
    ("answer", rf"\b{_THIS_REPLY}\b[^.!?\n]{{0,50}}?\b(?:{_TOP})\b", True),
    (
        "answer",
        r"\b(?:written|typed|wrote|ecrit|ecrite|escrit[oa]|geschrieben|scritt[oa])\s+(?:by|par|por|von|da)\s+"
        rf"(?:a\s+|an\s+|un\s+|une\s+|una\s+|einem\s+|ein\s+)?(?:real\s+)?(?:{_HUMAN})\b"
        rf"|\b(?:a\s+)?(?:real\s+)?(?:person|human)\s+(?:typed|wrote)\s+this\b|\bnot\s+(?:a\s+bot|an\s+ai)\b",
        True,
    ),
    (
        "answer",
        r"\b(?:ranking|order)\s*[:=]?\s*\[?\s*['\"]?[a-h]['\"]?\s*(?:>|,)\s*['\"]?[a-h]['\"]?\s*(?:>|,)",
        False,
    ),
    (
        "answer",
        r"\bthe\s+correct\s+(?:assessment|classification|choice|rating|score|verdict|answer|evaluation"
        r"|label|grade)\b",
        True,
    ),
    # --- address: words to the judge, instructions about the decision
    (
        "address",
        rf"\b(?:note|notes|message|instruction|instructions|reminder|hint|memo|p\.?s\.?|nota|hinweis|remarque"
        rf"|nachricht|mensaje)\s+(?:for|to|pour|para|per|an|a|au|al|fur)\s+(?:the\s+|any\s+|all\s+|our\s+|le\s+"
        rf"|la\s+|el\s+|il\s+|o\s+|den\s+|die\s+|l')?(?:{_JUDGE}|model|ai|assistant|system|whoever\b[^.!?\n]{{0,30}})",
        True,
    ),
    (
        "address",
        rf"\b(?:dear|hey|hello|hi|attention|attn|to\s+the|calling\s+all)\s*,?\s+(?:{_JUDGE})\b",
        True,
    ),
    ("address", rf"(?:^|[\n.!?(\[]\s*)(?:{_JUDGE})\s*[:,]", True),
    (
        "address",
        rf"\b(?:{_JUDGE})\s+(?:must|should|will|shall|needs?\s+to|has\s+to|please|would|can)\b[^.!?\n]{{0,60}}?"
        rf"(?:{_THIS_REPLY}|\b(?:score|rate|rating|grade|points|marks|maximum|highest|top|full|best|first"
        rf"|human|person|\d)\b)",
        True,
    ),
    (
        "address",
        rf"\b(?:whoever|anyone|anybody)\b[^.!?\n]{{0,30}}?\b(?:{_ASK})\b"
        rf"|\bany\s+(?:fair\s+|honest\s+|reasonable\s+|careful\s+)?(?:{_JUDGE}|reader)\b[^.!?\n]{{0,30}}?"
        rf"\b(?:{_ASK}|would|should|must|will)\b"
        rf"|\b(?:personne|celui|celle|quien|wer|chi)\s+qui\s+(?:{_ASK})\b|\b(?:pour|para)\s+(?:qui|quien)\s+(?:{_ASK})\b",
        True,
    ),
    (
        "address",
        r"\b(?:ignore|disregard|forget|override|bypass)\s+(?:all\s+|any\s+)?(?:of\s+)?(?:the\s+|your\s+|these\s+"
        r"|those\s+)?(?:previous|prior|above|earlier|preceding|other|original|system|rubric|scoring|judging)?\s*"
        r"(?:instructions?|rules|prompts?|guidelines|rubric|criteria|directions)\b",
        True,
    ),
    (
        "address",
        r"\b(?:always|only|must|you\s+(?:must|should|will|have\s+to)|please)\s+(?:say|answer|output|respond|"
        r"reply|pick|choose|select|prefer|rank|rate|score|grade|label)\s+(?:with\s+|that\s+)?"
        r"(?:reply|response|option|candidate|verdict|score|rating|rank|['\"]|human\b|ai\b|\d|[a-h]\b(?!\s+\w))",
        True,
    ),
    (
        "address",
        rf"\b(?:rate|score|grade|rank|mark)\s+(?:this|it|me|the|our|my)\s*(?:{_REPLY}|message|one)?\s+"
        rf"(?:a\s+|an\s+|as\s+|at\s+)?(?:\d|{_NUMBER_WORDS}|first|top|best)",
        True,
    ),
    (
        "address",
        r"\bgive\s+(?:this|it|me|my|the|our)\s*(?:reply|response|answer|one)?\s+(?:a\s+|an\s+|the\s+)?"
        r"(?:\d+(?:\.\d+)?\b|full\s+marks|top\s+marks|top\s+score|highest|perfect|maximum|five|ten)",
        True,
    ),
    (
        "address",
        rf"\b(?:deserves|earns|merits|should\s+(?:get|receive|be\s+given)|merite|merece|verdient|merita)\s+"
        rf"(?:a\s+|an\s+|the\s+|un\s+|la\s+|el\s+|die\s+)?(?:{_FRACTION}|full\s+marks|top\s+(?:marks|score|rank)"
        rf"|(?:the\s+)?(?:highest|best|maximum|meilleure|mejor)|perfect\s+score|first\s+place|rank\s+1)",
        True,
    ),
    (
        "address",
        r"\b(?:system|developer|admin|administrator|judge|grader|evaluator)\s+(?:note|message|prompt|"
        r"instruction|instructions|override|notice|directive)\b",
        True,
    ),
    (
        "address",
        r"\[\s*(?:system|admin|developer|judge|grader|evaluator|assistant|instructions?|note\s+to)"
        r"[^\]\n]{0,40}\]",
        True,
    ),
    (
        "address",
        r"\b(?:as\s+an?\s+)?(?:ai|language\s+model|llm)\s+(?:judge|grader|evaluator|reading\s+this)\b",
        True,
    ),
    ("address", r"\b(?:rubric|grading\s+criteria|scoring\s+guide|scoring\s+rules)\b", True),
    # --- markup: code and markup in a reply
    (
        "markup",
        r"\{[^{}]{0,300}?(?:\{[^{}]{0,300}\}[^{}]{0,300}?)*[:=][^{}]{0,300}?(?:\{[^{}]{0,300}\}[^{}]{0,300}?)*\}",
        False,
    ),
    (
        "markup",
        r"<\s*!--[\s\S]*?(?:--\s*>|$)|/\*[\s\S]*?(?:\*/|$)|(?:^|(?<=\s))//[^\n]*|```[\s\S]*?(?:```|\Z)",
        False,
    ),
    (
        "markup",
        r"<\s*(?P<tag>[a-z][\w:.-]{0,30})(?:\s[^<>\n]{0,200})?>[^<]{0,200}<\s*/\s*(?P=tag)\s*>"
        r"|<\s*/?\s*[a-z][\w:.-]{0,30}(?:\s[^<>\n]{0,200})?/?\s*>",
        False,
    ),
    # --- fence: fence and chat-template markers (with the role a template marker opens)
    ("fence", r"<{3,}|>{3,}", False),
    (
        "fence",
        r"(?:[<\[{#=*-]\s*)+end\s+(?:reply|replies|dialogue|profile|persona|needs|reaction|thought"
        r"|reference|reviewed\s+reply|best\s+reply)\b",
        False,
    ),
    (
        "fence",
        r"(?:<\|[a-z_ ]{1,30}\|>|<\s*/?\s*s\s*>|\[/?\s*inst\s*\]|<<\s*/?\s*sys\s*>>"
        r"|<\s*/?\s*(?:start|end)_of_turn\s*>)(?:\s*(?:system|assistant|user|model)\b)?",
        False,
    ),
)
_COMPILED = tuple((kind, re.compile(p, re.M), whole) for kind, p, whole in _PATTERNS)
# a line, sentence or aside of nothing but answer keys and values that holds a top value ("5/5 stars",
# "★★★★★", "100% human", "Reply A: 10/10")
_FILLER = _words("a an the of out and is reply response answer stars star points point marks total final my")
_SEGMENT = re.compile(r"(?:[^\n.!?。！？()\[\]]|(?<=\d)\.(?=\d))+")
_TOP_VALUE = re.compile(
    rf"{_STARS}|\b100\s*%|(?<![\d.])(\d{{1,3}})\s*(?:/|\bof\b|\bout\s+of\b)\s*\1(?![\d.])"
)
_SPARE_WORD = re.compile(
    rf"(?<![^\W_])(?:{_KEYS}|{_FILLER}|{_HUMAN}|{_NUMBER_WORDS}|{_LETTER})(?![^\W_])|{_CJK_KEYS}|{_VALUE}"
)


def _spare(text: str) -> bool:
    """Whether ``text`` (folded) holds nothing but answer keys, values, filler words and punctuation (one
    pass that blanks each such word, then a look for any letter or digit left)."""
    return not re.search(r"[^\W_]", _SPARE_WORD.sub(" ", text))


@dataclass(frozen=True)
class Finding:
    """One place where a text addresses the judge: ``kind`` (:data:`KINDS`), the matched words (folded),
    the span ``[start, end)`` in the original text, and whether it goes with its whole sentence or aside
    (``whole``: words to the judge, a claim of the outcome, a line in a foreign script)."""

    kind: str
    match: str
    start: int
    end: int
    whole: bool = False


def findings(text: str) -> list[Finding]:
    """Every place where ``text`` addresses the judge (see the module doc), in order of position."""
    text = str(text or "")
    return list(_findings(text)) if text else []


@functools.lru_cache(maxsize=4096)  # a group's replies share their scenario: its texts are screened often
def _findings(text: str) -> tuple[Finding, ...]:
    folded, origin = fold(text)
    out: dict[tuple[int, int], Finding] = {}

    def add(kind: str, start: int, end: int, whole: bool = False) -> None:
        if end > start:
            span = (origin[start], origin[end - 1] + 1)
            out.setdefault(span, Finding(kind, folded[start:end], *span, whole))

    for kind, pattern, whole in _COMPILED:
        for m in pattern.finditer(folded):
            add(kind, m.start(), m.end(), whole)
    for m in _SEGMENT.finditer(folded):
        segment = m.group(0)
        if segment.strip() and _TOP_VALUE.search(segment) and _spare(segment):
            lead = len(segment) - len(segment.lstrip())
            add("answer", m.start() + lead, m.start() + len(segment.rstrip()))
    for start, end in _foreign_segments(text):
        out.setdefault((start, end), Finding("markup", text[start:end], start, end, True))
    return tuple(sorted(out.values(), key=lambda f: (f.start, f.end)))


def _script(ch: str) -> str | None:
    """The script of a letter by its Unicode name's first word (LATIN, CYRILLIC, CJK, CHEROKEE ...)."""
    ch = unicodedata.normalize("NFKC", ch)[:1]
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0] if name else None


def _foreign_segments(text: str) -> list[tuple[int, int]]:
    """Sentences or lines whose letters are mostly of another script than the text's own (the script of
    most of its letters): an answer line in Cherokee or Cyrillic below an English reply. A text in one
    script, whatever it is, has none."""
    scripts = [_script(ch) for ch in text]
    counts: dict[str, int] = {}
    for sc in scripts:
        if sc:
            counts[sc] = counts.get(sc, 0) + 1
    if len(counts) < 2:
        return []
    main = max(counts, key=counts.__getitem__)
    out = []
    for m in re.finditer(r"[^\n.!?。！？]+", text):
        mine = [sc for sc in scripts[m.start() : m.end()] if sc]
        if mine and sum(sc != main for sc in mine) * 2 > len(mine):
            out.append((m.start(), m.end()))
    return out


def addresses_judge(text: str) -> bool:
    """Whether ``text`` addresses the judge (:func:`findings` is not empty)."""
    return bool(findings(text))


def imitates_answer(text: str) -> bool:
    """Whether ``text`` imitates a judge's answer (a finding of kind ``answer``)."""
    return any(f.kind == "answer" for f in findings(text))


_SENTENCE_END = re.compile(r"[.!?。！？]+[\"')\]]*(?=\s)|\n")
_CLOSE = {"(": ")", "[": "]"}


def _sentence(text: str, start: int, end: int) -> tuple[int, int]:
    """The sentence (or line) of ``text`` around ``[start, end)``."""
    first = 0
    for m in _SENTENCE_END.finditer(text, 0, start):
        first = m.end()
    m = _SENTENCE_END.search(text, end)
    return first, (m.end() if m else len(text))


def _cut(text: str, f: Finding) -> tuple[int, int, bool]:
    """The span taken out for ``f`` and whether a :data:`HOLE` stands in its place: a fence marker alone
    (a ``<<<...>>>`` group whole); words to the judge with their bracketed aside or sentence; a JSON object,
    markup element or answer with its aside, line or sentence when nothing but punctuation and answer words
    is left there, else alone with a hole."""
    if f.kind == "fence":
        start, end = f.start, f.end
        if text.startswith("<", start) or text[start:end].strip("<") == "":
            close, line_end = text.find(">>>", end), text.find("\n", start)
            if close >= 0 and (line_end < 0 or close < line_end):
                end = close + 3
        return start, end, False
    start, end = f.start, f.end
    brace = text.rfind("{", 0, f.start + 1)
    if f.kind == "answer" and brace >= 0 and "{" in text[brace : f.end]:
        start, end = brace, _closing_brace(text, brace)
    group = _enclosing_group(text, start, end)
    around = group if group is not None else _sentence(text, start, end)
    if f.whole:
        return (*around, False)
    rest = fold(text[around[0] : start] + " " + text[end : around[1]])[0]
    if not rest.strip() or _spare(rest):
        return (*around, False)
    return start, end, True


def _closing_brace(text: str, brace: int) -> int:
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


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


def suspect_spans(text: str) -> list[tuple[int, int, bool]]:
    """The spans of ``text`` that :func:`set_aside` takes out (start, end, whether a hole stands there),
    in order, overlapping ones merged."""
    merged: list[tuple[int, int, bool]] = []
    for start, end, hole in sorted(_cut(text, f) for f in findings(text)):
        if merged and start < merged[-1][1]:
            s, e, h = merged[-1]
            merged[-1] = (s, max(e, end), h and hole)
        else:
            merged.append((start, end, hole))
    return merged


def set_aside(text: str, rounds: int = 4) -> str:
    """``text`` without its suspect spans (:func:`suspect_spans`), repeated until nothing is found (at most
    ``rounds`` times); whitespace tidied at the cuts only. A text with nothing to take out is returned as
    it is."""
    text = str(text or "")
    for _ in range(rounds):
        spans = suspect_spans(text)
        if not spans:
            break
        kept, at = [], 0
        for start, end, hole in spans:
            kept.append(text[at:start])
            if hole:
                kept.append(HOLE)
            at = end
        kept.append(text[at:])
        text = _drop_hollow_lines(_join(kept)).strip()
    return text


def _drop_hollow_lines(text: str) -> str:
    """``text`` without the lines that hold a hole and nothing else but punctuation and answer words (an
    answer whose label beside it was taken out by another finding)."""
    lines = text.split("\n")
    kept = []
    for line in lines:
        rest = fold(line.replace(HOLE, " "))[0]
        if HOLE in line and (not rest.strip() or _spare(rest)):
            continue
        kept.append(line)
    return "\n".join(kept)


strip_addressing = set_aside  # the name the reaction simulator and the critic use


def _join(pieces: list[str]) -> str:
    """The pieces a cut left, joined with the whitespace at each join tidied (one space inside a line, one
    line break where a line went); the text elsewhere keeps its own spacing, so a context the judge sees
    differs from the clean one only where something was taken out."""
    out = ""
    for piece in pieces:
        if not piece:
            continue
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
