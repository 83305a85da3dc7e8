"""Stdlib rule-based salient span annotator: a date grammar plus a capitalisation-based name tagger.

REALM (Guu et al., 2020, §3.4 "Salient span masking") masks salient spans -- named entities, found with
a BERT tagger trained on CoNLL-2003, and dates, found with a regular expression. That tagger was never
released and no model can be downloaded at run time here, so this module approximates it with rules
that work well on Wikipedia prose (both ordinary text and the whitespace-tokenised text of
NaturalQuestions, "December 15 , 1791"):

* ``DATE``: full dates ("October 17, 1973", "17 October 1973", "April 12–13, 1861"), month-year
  ("March 1974", "May of 1968"), month-day ("July 4"), a month after a preposition ("in October"),
  seasons ("summer of 1969"), ISO dates, decades ("1990s"), centuries and millennia ("19th century",
  "nineteenth-century"), era years ("44 BC", "AD 1066") and bare years 1000-2099 unless the context
  says they count something ("1500 soldiers", "$2000", "1,500"); a leading "early" / "mid-" / "late"
  belongs to the date ("the late 1990s"). The years of a range ("1914–1918") are separate dates; a
  season ("2017–18") is one.
* ``ENTITY``: maximal runs of capitalised words (with initials "J. R. R.", acronyms "U.S.",
  name-internal abbreviations "St." / "Jr." / "Inc.", short numbers "Apollo 11" and connectors such as
  "of", "of the", "de", "van der", "&": "Bank of England", "Lord of the Rings"), and capitalised titles
  in double quotes ("Message in a Bottle"). A capitalised word opening a sentence is a name only if it
  is not a function word and the document gives evidence for it: it is capitalised elsewhere
  mid-sentence, or it is followed by another capitalised word (or by a parenthesis, as the subject of
  a Wikipedia lead sentence is) and never seen lower-case. Titles stay in the name ("President George
  W. Bush", "Queen Elizabeth II"), as in NaturalQuestions answers, unlike CoNLL-2003. Lists are not
  merged: a comma or "and" ends a name ("University of California, Berkeley" gives two spans).
* ``NUMBER`` (off by default, REALM masked only entities and dates): money, percentages and numbers
  with an optional scale word or unit.
"""
from __future__ import annotations

import re

from realm_tf.data import salient_span
from realm_tf.data import salient_span_annotator
from realm_tf.data import sentence_splitter

# ---------------------------------------------------------------------------------------------------
# Dates.

_MONTH_FULL = ("January|February|March|April|May|June|July|August|September|October|November|"
               "December")
_MONTH = rf"(?:{_MONTH_FULL}|(?:Jan|Feb|Mar|Apr|Jun|Jul|Aug|Sept|Sep|Oct|Nov|Dec)\.)"
_DAY = r"(?:3[01]|[12][0-9]|0?[1-9])(?:st|nd|rd|th)?"
_ERA = r"(?:BCE|BC|CE|AD|B\.C\.(?!\w)|A\.D\.(?!\w))"
_YEAR = rf"(?:\d{{1,4}}\s{_ERA}|(?:AD|A\.D\.)\s\d{{1,4}}|\d{{3,4}}(?:\s{_ERA})?)(?![\d,.]\d)"
_COMMA = r"\s?,?\s"
_RANGE = r"\s?(?:–|-|--)\s?"
_ORDINAL_WORDS = ("first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
                  "thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|"
                  "twentieth|twenty-first|twenty-second")
_YEAR_PREPOSITIONS = ("in|on|of|since|until|till|by|from|during|early|late|mid|between|to|and|"
                      "through|before|after|around|circa|c\\.|last|next|this|that|each|every")

_DATE_PATTERNS = [
    # October 17, 1973 / December 15 , 1791 / Oct. 17th 1973 / April 12–13, 1861
    re.compile(rf"\b{_MONTH}\s{_DAY}(?:{_RANGE}{_DAY})?(?:{_COMMA}{_YEAR})?(?!\d)"),
    # 17 October 1973 / the 4th of July, 1776 / 6–14 July 1789
    re.compile(rf"\b{_DAY}(?:{_RANGE}{_DAY})?\s(?:of\s)?{_MONTH}(?:{_COMMA}{_YEAR})?(?!\w)"),
    # March 1974 / May of 1968
    re.compile(rf"\b{_MONTH}\s(?:of\s)?{_YEAR}"),
    # summer of 1969 / Spring 1974
    re.compile(r"\b(?:[Ss]pring|[Ss]ummer|[Aa]utumn|[Ff]all|[Ww]inter)\s(?:of\s)?\d{4}(?!\d)"),
    # ISO 1973-10-17
    re.compile(r"\b\d{4}-[01]\d-[0-3]\d\b"),
    # 1990s / 1960's / 1800s
    re.compile(r"\b(?:1\d|20)\d0(?:s|['’]s)\b"),
    # 19th century / nineteenth-century / 3rd millennium BC / 19th and 20th centuries
    re.compile(rf"\b(?:\d{{1,2}}(?:st|nd|rd|th)|(?i:{_ORDINAL_WORDS}))[\s-](?:centur(?:y|ies)|"
               rf"millenni(?:um|a))(?:\s{_ERA})?\b"),
    # A season or fiscal year: 2017–18 / 2017 -- 18 / 2004/05 (full-year ranges stay two dates).
    re.compile(r"\b(?:1\d|20)\d\d(?:\s?(?:–|-|--)\s?|/)\d\d(?![\d–/-]|\s(?:–|-|--)\s?\d)"),
    # 44 BC / AD 1066 / 500 BCE
    re.compile(rf"\b(?:\d{{1,4}}\s{_ERA}|(?:AD|A\.D\.)\s\d{{1,4}}\b)"),
]

# A month name on its own is a date only after a preposition ("in October"); "May" is also a name.
# Words before a number 1000-1499 that make it a year ("in 1066", "by 1200"; not "of 1200 men").
_YEAR_CONTEXT_WORDS = frozenset(
    "in on since until till by from during early late mid between through before after around circa c."
    .split())
_RANGE_AFTER = re.compile(r"\s?(?:–|—|-|--)\s?\d{3,4}(?!\d)")
_RANGE_BEFORE = re.compile(r"(?<!\d)\d{3,4}\s?(?:–|—|-|--)\s?$")
_DATE_MODIFIER = re.compile(r"(?i:\b(?:early|mid|late))(?:-|\s)$")
_BARE_MONTH = re.compile(rf"\b(?i:{_YEAR_PREPOSITIONS})\s({_MONTH_FULL})\b(?!\s\d)")
_BARE_YEAR = re.compile(r"(?<![\w$£€¥#.,/-])(\d{4})(?![\w%]|[.,]\d|\s?%)")
_WORD_BEFORE = re.compile(r"(\S+)\s+$")
_WORD_AFTER = re.compile(r"^\s+([^\s]+)")

# Words after a number that show it counts something, so "1500 soldiers" is not a year.
_COUNT_NOUNS = frozenset(
    """
    people persons men women children soldiers troops officers workers employees staff members
    residents inhabitants households families students pupils voters votes seats copies units sales
    km kilometres kilometers km2 miles mi metres meters m cm mm ft feet foot inches yards yd kg g mg
    lb lbs pounds tons tonnes acres hectares ha square cubic sq litres liters gallons barrels mph
    km/h hp calories kcal rpm points runs goals games matches episodes songs pages words species
    years days hours minutes seconds ships aircraft planes tanks guns cars vehicles buildings homes
    houses rooms beds cases deaths casualties victims prisoners refugees tourists visitors copies
    dollars euros francs marks yen rupees pesos
    """.split()
)
_NUMBER_CONTEXT_BEFORE = frozenset(
    "than over under about approximately nearly almost some only least most population route "
    "no. number highway interstate".split()
)

# ---------------------------------------------------------------------------------------------------
# Names.

# Words that are capitalised at the start of a sentence (or in a title) but are not names.
_FUNCTION_WORDS = frozenset(
    """
    a an the this that these those there here it its it's he him his she her hers they them their
    theirs we us our ours i me my mine you your yours who whom whose which what whatever when where
    why how whether and or but nor so yet for if then than because although though while whereas
    unless until since after before during as at by from in into of off on onto out over under up
    upon with within without to toward towards through throughout across along among amongst around
    about above below behind beneath beside besides between beyond despite except inside outside
    near per via against following according regarding concerning including unlike like
    however therefore thus hence moreover furthermore additionally also meanwhile nevertheless
    nonetheless otherwise instead indeed likewise similarly consequently accordingly subsequently
    later earlier eventually finally initially originally previously currently recently today
    tomorrow yesterday now then once again already still soon often sometimes usually generally
    typically especially particularly primarily mainly mostly largely partly only even just both
    either neither each every all any some many much most more few fewer less least several other
    others another such same no not none nothing nobody everything everyone someone something
    anyone anything one two three four five six seven eight nine ten first second third last next
    new old early late is are was were be been being am has have had having do does did done
    would should could let yes oh well please see note notes
    although unlike despite given based due prior apart aside rather whereby wherein thereafter
    afterwards overall altogether ultimately perhaps probably possibly certainly clearly
    """.split()
)

# Connectors allowed inside a name when a capitalised word follows them.
_CONNECTORS = frozenset(
    "of for de da di del della dei des du la le van von der den ten ter zu bin ibn al el y upon & 'n'"
    .split()
)
_CONNECTOR_CONTINUATIONS = _CONNECTORS | {"the"}

# Heads that take an "of" / "for" complement inside a name ("Bank of England", "Reserve Bank of India",
# "Centers for Disease Control"). After any other multi-word name, "of" starts a new name: "Bobby
# Hurley of Duke" is two names. "for" joins only after one of these heads.
_NAME_HEADS = frozenset(
    """
    academy act acts administration agency alliance archbishop army assembly association bank basilica
    battle bay bill bishop board book books brotherhood bureau campaign cape cathedral center centers
    centre centres chamber championship championships chancellor chapel chief church city coalition
    college commission commissioner committee commonwealth company conference confederation congress
    constitution corporation corps council count countess county court crown cup daughters declaration
    department director division duchess duke earl emperor empire empress epistle faculty federation
    festival force forces foundation fund gallery games garden gardens general gospel government
    governor guild gulf hall head house houses institute institution isle island islands king kingdom
    knights lady lake league legion library lord lords marquess mayor minister ministry monastery
    mount mountains museum navy need office order organisation organization palace parliament party
    peace prince princess professor province queen regiment republic school secretary senate siege
    sisters society sons state states statue sultan system temple tower treaty tribunal union
    university valley viscount war
    """.split()
)
_ROMAN_NUMERAL = re.compile(r"[IVXL]+")

# Honorific abbreviations: part of a name only when a name follows ("Mr. Smith", "Dr. Dre").
_HONORIFICS = frozenset(
    "Mr. Mrs. Ms. Dr. Prof. Gen. Gov. Sen. Rep. Capt. Col. Lt. Sgt. Rev. Hon. Pres. Adm. Maj.".split())

_MONTH_AND_DAY_NAMES = frozenset(
    (_MONTH_FULL + "|Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday").lower().split("|"))

_ABBREVIATION_TOKENS = ("St|Mt|Ft|Jr|Sr|Inc|Ltd|Co|Corp|Bros|Mr|Mrs|Ms|Dr|Prof|Gen|Col|Lt|Capt|Sgt|"
                        "Gov|Sen|Rep|Rev|Hon|Pres|Adm|Maj")
_TOKEN = re.compile(
    r"(?:[A-Za-z]\.){2,}(?![A-Za-z])"          # dotted acronyms and shorthands: U.S., U.S.A., e.g.
    rf"|(?:{_ABBREVIATION_TOKENS})\.(?!\w)"     # name-internal abbreviations: St., Jr., Inc., Mr.
    r"|[A-Z]\.(?=\s)"                           # initials: J. R. R. Tolkien
    r"|\w+(?:(?:[-–]|['’](?!s\b))\w+)*"         # words, hyphenated words, O'Brien (not "'s")
    r"|['’]s\b"                                 # possessive
    r"|\S"                                      # any other single character
)
_SHORT_NUMBER = re.compile(r"\d{1,3}|\d+[A-Za-z]+")
# Double-quoted text; NaturalQuestions writes quotes as `` ... ''.
_QUOTED = re.compile(r"(?:[\"“]|``)\s?([^\"“”`\n]{1,120}?)\s?(?:[\"”]|'')")
_TITLE_LOWER = frozenset(
    "a an the of in on at to for and or but nor with by from as is be into over vs. vs v. de la le"
    .split()
)
_OPENING_PUNCTUATION = frozenset("\"'“‘«([{-–—*•`")

# ---------------------------------------------------------------------------------------------------
# Numbers (optional).

_SCALE = r"(?:\s(?:thousand|million|billion|trillion))?"
_UNIT = (r"(?:\s?(?:%|percent|per\scent)|\s(?:km|kilometres|kilometers|miles|mi|metres|meters|m|cm|mm|"
         r"ft|feet|inches|yards|kg|g|mg|lb|lbs|pounds|oz|ounces|tons|tonnes|acres|hectares|ml|l|"
         r"litres|liters|gallons|mph|km/h|degrees|°C|°F)\b)?")
_NUMBER_PATTERN = re.compile(
    r"(?<![\w.])(?:(?:(?:US|U\.S\.|A|C|NZ|HK)\s?)?[$£€¥]\s?\d[\d,]*(?:\.\d+)?" + _SCALE
    + r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?" + _SCALE + _UNIT
    + r"|\d+(?:\.\d+)?" + _SCALE + _UNIT + r")(?![\w])"
)


class RuleBasedSpanAnnotator(salient_span_annotator.SalientSpanAnnotator):
    """Salient spans (REALM §3.4) from a date grammar and a capitalisation-based name tagger.

    Args:
      include_numbers: also return ``NUMBER`` spans (money, percentages, quantities). REALM masked
        entities and dates only, so this is off by default.
      splitter: the sentence splitter that decides which words are sentence-initial.
    """

    def __init__(self, include_numbers: bool = False,
                 splitter: sentence_splitter.SentenceSplitter | None = None) -> None:
        self._include_numbers = include_numbers
        self._splitter = splitter or sentence_splitter.SentenceSplitter()

    def annotate(self, text: str) -> list[salient_span.SalientSpan]:
        """Returns the sorted, non-overlapping DATE / ENTITY (/ NUMBER) spans of ``text``."""
        if not text.strip():
            return []
        dates = salient_span_annotator.resolve_overlaps(self._dates(text))
        tokens = [(m.start(), m.end(), m.group()) for m in _TOKEN.finditer(text)]
        in_date = _covered(tokens, dates)
        sentence_initial = self._sentence_initial(text, tokens)
        entities = self._entities(text, tokens, in_date, sentence_initial)
        titles = self._quoted_titles(text)
        spans = salient_span_annotator.resolve_overlaps(dates + entities + titles)
        if self._include_numbers:
            numbers = [_trimmed(text, m.start(), m.end(), salient_span.NUMBER)
                       for m in _NUMBER_PATTERN.finditer(text)]
            numbers = [span for span in numbers if span is not None]
            spans = _add_without_overlap(spans, numbers)
        return spans

    # -- dates -------------------------------------------------------------------------------------

    def _dates(self, text: str) -> list[salient_span.SalientSpan]:
        spans = []
        for pattern in _DATE_PATTERNS:
            for match in pattern.finditer(text):
                spans.append(_trimmed(text, match.start(), match.end(), salient_span.DATE))
        for match in _BARE_MONTH.finditer(text):
            spans.append(salient_span.SalientSpan(match.start(1), match.end(1), salient_span.DATE))
        for match in _BARE_YEAR.finditer(text):
            if self._is_year(text, match):
                spans.append(salient_span.SalientSpan(match.start(1), match.end(1), salient_span.DATE))
        spans = [span for span in spans if span is not None]
        return [_with_modifier(text, span) for span in spans]

    @staticmethod
    def _is_year(text: str, match: re.Match[str]) -> bool:
        value = int(match.group(1))
        if not 1000 <= value <= 2099:
            return False
        before = _WORD_BEFORE.search(text, max(0, match.start() - 40), match.start())
        after = _WORD_AFTER.search(text[match.end():match.end() + 40])
        word_before = before.group(1).lower() if before else ""
        word_after = after.group(1).lower().rstrip(".,;:)") if after else ""
        if word_after in _COUNT_NOUNS or word_before in _NUMBER_CONTEXT_BEFORE:
            return False
        if value >= 1500:
            return True
        # 1000-1499 are as often counts as years: ask for a year context.
        return (word_before.rstrip(",") in _YEAR_CONTEXT_WORDS or word_after in ("ad", "bc", "ce", "bce")
                or _RANGE_AFTER.match(text, match.end()) is not None  # "1493–1541"
                or _RANGE_BEFORE.search(text, max(0, match.start() - 12), match.start()) is not None)

    # -- names -------------------------------------------------------------------------------------

    def _sentence_initial(self, text: str, tokens: list[tuple[int, int, str]]) -> list[bool]:
        """Marks the first word token of each sentence (after opening quotes and brackets)."""
        initial = [False] * len(tokens)
        sentences = self._splitter.split(text)
        t = 0
        for start, end in sentences:
            while t < len(tokens) and tokens[t][0] < start:
                t += 1
            k = t
            while k < len(tokens) and tokens[k][0] < end and tokens[k][2] in _OPENING_PUNCTUATION:
                k += 1
            if k < len(tokens) and tokens[k][0] < end:
                initial[k] = True
        return initial

    def _entities(self, text: str, tokens: list[tuple[int, int, str]], in_date: list[bool],
                  sentence_initial: list[bool]) -> list[salient_span.SalientSpan]:
        capitalised = [_is_capitalised(tok[2]) and not in_date[i] for i, tok in enumerate(tokens)]
        name_start = _name_starts(tokens, capitalised, sentence_initial)
        spans = []
        i = 0
        while i < len(tokens):
            if not name_start[i]:
                i += 1
                continue
            j = _name_end(text, tokens, i, capitalised, in_date, sentence_initial)
            run = _trim_run(tokens, i, j)
            if run is not None:
                a, b = run
                spans.append(
                    salient_span.SalientSpan(tokens[a][0], tokens[b - 1][1], salient_span.ENTITY))
            i = j
        return spans

    @staticmethod
    def _quoted_titles(text: str) -> list[salient_span.SalientSpan]:
        """Capitalised titles in double quotes: "Message in a Bottle", "The Power of Now"."""
        spans = []
        for match in _QUOTED.finditer(text):
            inner = match.group(1)
            words = re.findall(r"[\w'’]+", inner)
            if not words or len(words) > 12 or not words[0][0].isupper():
                continue
            if inner.rstrip()[-1:] in ".,;:":
                continue
            content = [w for w in words if w.lower() not in _TITLE_LOWER]
            if not content or any(not w[0].isupper() and not w[0].isdigit() for w in content):
                continue
            if len(words) == 1 and words[0].lower() in _FUNCTION_WORDS:
                continue
            span = _trimmed(text, match.start(1), match.end(1), salient_span.ENTITY)
            if span is not None:
                spans.append(span)
        return spans


def _joins(tokens: list[tuple[int, int, str]], i: int, j: int) -> bool:
    """Whether the connector at ``j`` continues the name ``tokens[i:j]`` (see ``_NAME_HEADS``)."""
    head = tokens[j - 1][2]
    if head.lower() in _NAME_HEADS or _ROMAN_NUMERAL.fullmatch(head):
        return True  # "Bank of England", "Henry VIII of England".
    if tokens[j][2].lower() == "for":
        return False
    return j - i == 1  # "Joan of Arc", "Rio de Janeiro"; not "Mr. Smith of ...".


def _is_function_word(word: str) -> bool:
    """A function word ("The", "However"); an acronym ("US", "IT") is never one."""
    return word.lower() in _FUNCTION_WORDS and not (len(word) >= 2 and word.isupper())


def _followed_by_name(tokens: list[tuple[int, int, str]], capitalised: list[bool], k: int) -> bool:
    """Whether a capitalised non-function word follows at ``k``, possibly after connectors."""
    start = k
    while k < len(tokens) and k - start < 3 and tokens[k][2].lower() in _CONNECTOR_CONTINUATIONS:
        k += 1
    return k < len(tokens) and capitalised[k] and not _is_function_word(tokens[k][2])


def _is_capitalised(word: str) -> bool:
    """Whether a token is capitalised like a name part ("Paris", "U.S.", "J.", "Coca-Cola")."""
    first = word[0]
    if not first.isupper():
        return False
    parts = re.split(r"[-–]", word)
    if len(parts) > 1:
        # "Anglo-Saxon", "Stratford-upon-Avon" but not "French-speaking" or "X-ray".
        return parts[-1][:1].isupper() or parts[-1][:1].isdigit()
    return True


def _looks_like_name(word: str) -> bool:
    """Name evidence within the word itself: an acronym ("NATO") or an inner capital ("McDonald")."""
    letters = word.replace(".", "")
    if len(letters) >= 2 and letters.isupper():
        return True
    return any(c.isupper() for c in word[1:]) and word[1:].lower() != word[1:]


def _trim_run(tokens: list[tuple[int, int, str]], i: int, j: int) -> tuple[int, int] | None:
    """Trims a capitalised run [i, j) to a name: no trailing connectors or function words."""
    while j > i:
        last = tokens[j - 1][2]
        roman_one = last == "I" and j - i > 1  # "World War I", not the pronoun.
        if last.lower() not in _CONNECTOR_CONTINUATIONS and (roman_one or not _is_function_word(last)):
            break
        j -= 1
    if j <= i:
        return None
    words = [tokens[k][2] for k in range(i, j)]
    if all(_is_function_word(w) or w.lower() in _CONNECTOR_CONTINUATIONS for w in words):
        return None
    if len(words) == 1 and (words[0].lower() in _MONTH_AND_DAY_NAMES or len(words[0].rstrip(".")) == 1):
        return None
    return i, j


def _with_modifier(text: str, span: salient_span.SalientSpan) -> salient_span.SalientSpan:
    """Extends a date over a leading "early", "mid-" or "late" ("late 1990s", "mid-19th century")."""
    modifier = _DATE_MODIFIER.search(text, max(0, span.start - 6), span.start)
    if modifier is None:
        return span
    return salient_span.SalientSpan(modifier.start(), span.end, span.label)


def _covered(tokens: list[tuple[int, int, str]], spans: list[salient_span.SalientSpan]) -> list[bool]:
    """Marks tokens that overlap one of the sorted, non-overlapping ``spans``."""
    covered = [False] * len(tokens)
    s = 0
    for i, (start, end, _) in enumerate(tokens):
        while s < len(spans) and spans[s].end <= start:
            s += 1
        if s < len(spans) and spans[s].start < end:
            covered[i] = True
    return covered


def _trimmed(text: str, start: int, end: int, label: str) -> salient_span.SalientSpan | None:
    while start < end and text[start].isspace():
        start += 1
    while end > start and (text[end - 1].isspace() or text[end - 1] == ","):
        end -= 1
    if end <= start:
        return None
    return salient_span.SalientSpan(start, end, label)


def _add_without_overlap(spans: list[salient_span.SalientSpan],
                         extra: list[salient_span.SalientSpan]) -> list[salient_span.SalientSpan]:
    """Adds the ``extra`` spans that overlap none of ``spans`` (nor each other), sorted."""
    kept = list(spans)
    for span in salient_span_annotator.resolve_overlaps(extra):
        if not any(span.overlaps(other) for other in spans):
            kept.append(span)
    kept.sort(key=lambda s: (s.start, s.end))
    return kept


def _name_starts(tokens: list[tuple[int, int, str]], capitalised: list[bool],
                 sentence_initial: list[bool]) -> list[bool]:
    """Which tokens start a name: capitalised ones, weighed against the document's own evidence (forms capitalised
    mid-sentence, forms seen lower-case) when they open a sentence."""
    capitalised_inside: set[str] = set()
    lower_seen: set[str] = set()
    for i, (_, _, word) in enumerate(tokens):
        if capitalised[i] and not sentence_initial[i]:
            capitalised_inside.add(word.lower())
        elif word[:1].islower():
            lower_seen.add(word)
    name_start = [False] * len(tokens)
    for i, (_, _, word) in enumerate(tokens):
        if not capitalised[i] or word == "I":
            continue
        if word in _HONORIFICS:
            name_start[i] = i + 1 < len(tokens) and capitalised[i + 1]
            continue
        if _is_function_word(word):
            # "The Beatles" mid-sentence; a sentence-initial "The" is never part of a name.
            name_start[i] = (not sentence_initial[i] and i + 1 < len(tokens) and capitalised[i + 1]
                             and not _is_function_word(tokens[i + 1][2]))
            continue
        lower = word.lower()
        if not sentence_initial[i]:
            name_start[i] = True
        elif lower in capitalised_inside:
            name_start[i] = True
        elif lower in lower_seen:
            name_start[i] = False
        else:
            # "Paracelsus (1493–1541) developed ...": a parenthesis after the subject of a
            # Wikipedia lead sentence.
            name_start[i] = (_followed_by_name(tokens, capitalised, i + 1)
                             or _looks_like_name(word)
                             or (i + 1 < len(tokens) and tokens[i + 1][2] == "("))
    return name_start


def _name_end(text: str, tokens: list[tuple[int, int, str]], i: int, capitalised: list[bool],
              in_date: list[bool], sentence_initial: list[bool]) -> int:
    """The exclusive end of the name that starts at token ``i``: it runs over capitalised tokens, "I", short
    numbers, hyphens and connectors ("of", "the") between capitalised words, up to a sentence or a line."""
    n = len(tokens)
    j = i + 1
    while j < n and not sentence_initial[j]:
        if tokens[j][0] - tokens[j - 1][1] > 1 and "\n" in text[tokens[j - 1][1]:tokens[j][0]]:
            break
        if capitalised[j]:
            j += 1
            continue
        if tokens[j][2] == "I":
            j += 1  # "World War I".
            continue
        if (_SHORT_NUMBER.fullmatch(tokens[j][2]) and not in_date[j]
                and (j + 1 == n or not (capitalised[j + 1] or tokens[j + 1][2][0].isdigit()))):
            j += 1  # "Apollo 11", "San Francisco 49ers"; not "Warriors 4 Cavaliers 1".
            continue
        if (tokens[j][2] == "-" and j + 1 < n and capitalised[j + 1] and not in_date[j + 1]
                and not _is_function_word(tokens[j + 1][2])):
            j += 2  # Whitespace-tokenised hyphenated names: "Daniel Day - Lewis".
            continue
        k = j
        while (k < n and k - j < 3 and tokens[k][2].lower() in _CONNECTOR_CONTINUATIONS
               and (k > j or tokens[k][2].lower() in _CONNECTORS)):
            k += 1
        if (k > j and k < n and capitalised[k] and not _is_function_word(tokens[k][2])
                and _joins(tokens, i, j)):
            j = k + 1
            continue
        break
    return j
