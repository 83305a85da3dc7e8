"""Rule-based English sentence splitter for Wikipedia prose (stdlib only).

REALM (Guu et al., 2020, §3.4 "Salient span masking") tags salient spans sentence by sentence, and the
rule-based tagger here needs sentence starts to tell a capitalised common word ("The", "However") from
a name. The splitter returns character spans, never rewritten text, so offsets found inside a sentence
map straight back onto the document: every non-whitespace character of the text lies in exactly one
span, and only whitespace lies between spans.

A boundary is placed after ``.``, ``?``, ``!``, ``…`` or ``...`` (plus any closing quotes, brackets
and ``[12]``-style citation marks) when whitespace follows and the next word can start a sentence
(capital letter, digit or an opening quote/bracket), unless the period belongs to an abbreviation
("Mr.", "e.g.", "Jan.", "St."), an initial ("J. R. R. Tolkien") or a number ("3.5"). Paragraph breaks
are always boundaries; single newlines are too by default (Wikipedia dumps put one paragraph a line).
It also copes with whitespace-tokenised text ("ends here . Next one"), as found in NaturalQuestions.
"""
from __future__ import annotations

import re

# Abbreviations after which a period never ends a sentence: titles before names, Latin shorthands, and
# month / reference abbreviations that are followed by a number or a name.
_NEVER_FINAL = frozenset(
    """
    mr mrs ms messrs dr prof rev revd hon st mt ft pt fr gen col lt maj capt cmdr adm sgt
    cpl pvt gov sen rep pres supt insp det brig
    e.g i.e cf viz vs v al approx ca c fl
    jan feb mar apr jun jul aug sep sept oct nov dec
    """.split()
)

# Abbreviations that introduce a number ("No. 7", "pp. 12", "b. 1950"): no boundary before a digit.
_BEFORE_NUMBER = frozenset(
    "no nos vol vols pp p fig figs ch chap sec art eq eqs op ref refs b d r".split())

# Abbreviations that often end a sentence too ("... founded Apple Inc. The company ..."): the period
# ends the sentence only when the next word is a typical sentence opener.
_SOMETIMES_FINAL = frozenset(
    """
    inc ltd co corp plc llc bros etc jr sr esq ph.d phd m.d b.a m.a b.sc m.sc a.m p.m
    a.d b.c bc ad ce bce
    """.split()
)

# Words that open a sentence far more often than they continue a name after an abbreviation.
_SENTENCE_OPENERS = frozenset(
    """
    a an the this that these those it its he she they we i you his her their our there here
    in on at by for from with after before during since when while although though however
    but and or so yet also as if because despite following according many some most several
    one two three each both all other another such no not its
    """.split()
)

_CLOSERS = "\"'”’»)]}"
_OPENERS = "\"'“‘«([{"
_TERMINATOR = re.compile(r"\.{2,}|…|[.?!]+")
_CITATION = re.compile(r"\[(?:\d+|[a-z]|note \d+|citation needed)\]", re.IGNORECASE)
_NOT_IN_WORD = frozenset("\"'“”‘’«»()[]{}")
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")


class SentenceSplitter:
    """Splits text into sentence character spans (REALM §3.4 salient span masking works per sentence).

    Args:
      newline_is_boundary: if True (default), every newline ends a sentence, as in Wikipedia dumps
        with one paragraph a line. Blank lines always end a sentence.
    """

    def __init__(self, newline_is_boundary: bool = True) -> None:
        self._newline_is_boundary = newline_is_boundary

    def split(self, text: str) -> list[tuple[int, int]]:
        """Returns ``[(start, end), ...]`` sentence spans, in order, whitespace trimmed.

        The spans cover every non-whitespace character of ``text`` exactly once; ``text`` is
        recovered by joining ``text[start:end]`` with the whitespace between the spans.
        """
        spans: list[tuple[int, int]] = []
        for block_start, block_end in self._blocks(text):
            start = block_start
            for cut in self._boundaries(text, block_start, block_end):
                self._append(text, start, cut, spans)
                start = cut
            self._append(text, start, block_end, spans)
        return spans

    def _blocks(self, text: str) -> list[tuple[int, int]]:
        """Paragraph (or line) blocks that no sentence crosses."""
        pattern = re.compile(r"\n") if self._newline_is_boundary else _PARAGRAPH_BREAK
        blocks = []
        start = 0
        for match in pattern.finditer(text):
            blocks.append((start, match.start()))
            start = match.end()
        blocks.append((start, len(text)))
        return blocks

    @staticmethod
    def _append(text: str, start: int, end: int, spans: list[tuple[int, int]]) -> None:
        while start < end and text[start].isspace():
            start += 1
        while end > start and text[end - 1].isspace():
            end -= 1
        if end > start:
            spans.append((start, end))

    def _boundaries(self, text: str, start: int, end: int) -> list[int]:
        cuts = []
        for match in _TERMINATOR.finditer(text, start, end):
            cut = match.end()
            # Closing quotes/brackets and citation marks belong to the sentence they close.
            while cut < end:
                if text[cut] in _CLOSERS:
                    cut += 1
                    continue
                citation = _CITATION.match(text, cut, end)
                if citation:
                    cut = citation.end()
                    continue
                break
            # Whitespace-tokenised text: a closing quote or bracket standing alone after the period.
            if cut < end - 1 and text[cut] == " " and text[cut + 1] in "\"”’)]" and (
                    cut + 2 >= end or text[cut + 2].isspace()):
                cut += 2
            if cut < end and not text[cut].isspace():
                continue  # "3.5", "U.S.", "?!" inside a token: not a boundary.
            next_start = cut
            while next_start < end and text[next_start].isspace():
                next_start += 1
            if next_start >= end:
                continue  # The block's end closes the sentence anyway.
            if self._is_boundary(text, match, start, next_start, end):
                cuts.append(cut)
        return cuts

    def _is_boundary(self, text: str, match: re.Match[str], block_start: int, next_start: int,
                     end: int) -> bool:
        next_word = _next_word(text, next_start, end)
        first = next_word[:1]
        if not first:
            return False
        starts_like_sentence = first.isupper() or first.isdigit()
        if not starts_like_sentence:
            return False  # "e.g. the", "... and so on", lower-case continuation.
        terminator = match.group()
        if terminator != ".":
            return True  # "?", "!", "...", "…": ends a sentence before a capital.
        word = _word_before(text, block_start, match.start())
        if not word:
            return True  # Whitespace-tokenised text: "end of sentence . Next".
        token = word.lower()
        if first.isdigit():
            # "Jan. 5", "No. 7", "pp. 12", "3.2. 1.20": a number after an abbreviation or a number.
            if (token in _NEVER_FINAL or token in _SOMETIMES_FINAL or token in _BEFORE_NUMBER
                    or word[-1].isdigit()):
                return False
            return True
        if token in _NEVER_FINAL:
            return False
        opener = next_word.lower() in _SENTENCE_OPENERS
        if token in _SOMETIMES_FINAL:
            return opener
        if len(word) == 1 and word.isalpha() and word.isupper():
            return False  # An initial: "J. R. R. Tolkien", "George W. Bush".
        if re.fullmatch(r"(?:[A-Za-z]\.)+[A-Za-z]", word):
            return opener  # A dotted acronym, "U.S." or "e.g": a sentence ends only before an opener.
        return True


def _next_word(text: str, start: int, end: int) -> str:
    """The next word after ``start``, skipping opening quotes and brackets."""
    i = start
    while i < end and text[i] in _OPENERS:
        i += 1
    j = i
    while j < end and (text[j].isalnum() or text[j] in "-'’"):
        j += 1
    return text[i:j]


def _word_before(text: str, start: int, end: int) -> str:
    """The word (letters, digits, inner periods) that ends at ``end``, e.g. "Mr", "U.S", "e.g"."""
    i = end
    while i > start and not text[i - 1].isspace() and text[i - 1] not in _NOT_IN_WORD:
        i -= 1
    return text[i:end]
