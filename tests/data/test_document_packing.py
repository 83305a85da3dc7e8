"""pack_document: a tokenized document -> blocks that cover its body exactly (Guu et al., 2020, §4.1)."""
import numpy as np
import tensorflow as tf

from realm_tf.data import block_packer
from realm_tf.data import corpus_reader
from realm_tf.data import document_packing
from realm_tf.data import example_schemas

# A toy vocabulary: one wordpiece per word, except "##" pieces for the second half of words longer than 4.
_CONTINUATION = np.zeros(100, dtype=bool)
_CONTINUATION[50:] = True


def _tokenize_sentence(body: str, start: int, end: int) -> document_packing.Sentence:
    """Word pieces of body[start:end] with their UTF-8 byte offsets within the sentence (a brute-force
    tokenizer: a word is one piece, or two when longer than four characters)."""
    text = body[start:end]
    ids, byte_starts = [], []
    position = 0
    for word in text.split():
        char = text.index(word, position)
        position = char + len(word)
        byte = len(text[:char].encode("utf-8"))
        ids.append(1 + len(word) % 40)
        byte_starts.append(byte)
        if len(word) > 4:
            ids.append(50 + len(word) % 40)
            byte_starts.append(byte + len(word[:4].encode("utf-8")))
    return document_packing.Sentence(start, end, np.array(ids, np.int32), np.array(byte_starts, np.int64))


def _document(title: str, body: str) -> corpus_reader.Document:
    return corpus_reader.Document(doc_id="d1", title=title, text=body, file="f", line=1,
                                  content_hash=example_schemas.block_uid(title, body))


def test_blocks_cover_the_body_in_order_and_keep_every_wordpiece():
    body = ("Short one. A much longer sentence with élan and several extraordinarily lengthy words inside. "
            "Tiny. Another sentence follows here.")
    bounds, start = [], 0
    for piece in body.split(". "):
        end = start + len(piece) + (1 if start + len(piece) < len(body) else 0)
        bounds.append((start, min(end, len(body))))
        start = end + 1
    sentences = [_tokenize_sentence(body, s, e) for s, e in bounds]
    packer = block_packer.BlockPacker(max_block_length=12, max_title_length=2)
    title_ids = np.array([7, 8, 9], np.int32)
    blocks = document_packing.pack_document(_document("The title", body), title_ids, sentences, packer,
                                            _CONTINUATION)
    assert len(blocks) > 2
    all_ids = np.concatenate([s.ids for s in sentences]).tolist()
    assert [i for b in blocks for i in b.body_ids] == all_ids  # nothing dropped, nothing repeated
    # the texts in order are the body with only whitespace missing
    assert "".join("".join(b.text.split()) for b in blocks) == "".join(body.split())
    for index, block in enumerate(blocks):
        assert block.block_index == index and block.title_ids == (7, 8)  # title truncated to 2
        assert len(block.title_ids) + len(block.body_ids) + 3 <= 12
        assert block.text and block.text in body and block.text == block.text.strip()
        assert block.uid == example_schemas.block_uid("The title", block.text)
        # a block never starts on a "##" piece unless one word is longer than a block
        assert not _CONTINUATION[block.body_ids[0]]
    positions = [body.index(b.text) for b in blocks]
    assert positions == sorted(positions)


def test_block_to_example_round_trips_through_the_block_schema():
    block = document_packing.Block(uid="u", doc_id="d", block_index=2, title="T", text="body text",
                                   title_ids=(5, 6), body_ids=(7, 8, 9))
    parsed = tf.io.parse_single_example(document_packing.block_to_example((41, block)),
                                        example_schemas.block_feature_spec())
    assert int(parsed[example_schemas.BLOCK_ID]) == 41
    assert parsed[example_schemas.TEXT].numpy().decode() == "body text"
    assert parsed[example_schemas.BODY_IDS].numpy().tolist() == [7, 8, 9]
    assert parsed[example_schemas.TITLE_IDS].numpy().tolist() == [5, 6]
