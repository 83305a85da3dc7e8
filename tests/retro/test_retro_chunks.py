"""RETRO's chunks (Borgeaud et al., 2021, §2.3): a document's token stream cut into m-token chunks with their
continuations, checked against a brute-force reading of the definition."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf.data import example_schemas
from realm_tf.retro import retro_chunks


@pytest.mark.parametrize("num_tokens,m,c", [(0, 4, 4), (1, 4, 4), (4, 4, 4), (9, 4, 4), (10, 3, 0), (17, 5, 12)])
def test_chunks_cover_the_stream_once_with_their_continuations(num_tokens, m, c):
    tokens = list(np.random.default_rng(num_tokens).integers(100, 999, size=num_tokens))
    document = retro_chunks.chunk_document("d", tokens, m, c)
    assert document.num_tokens == num_tokens and document.doc_key == retro_chunks.doc_key("d")
    assert [t for chunk in document.chunks for t in chunk.tokens] == tokens  # every token once, in order
    assert len(document.chunks) == -(-num_tokens // m)
    for index, chunk in enumerate(document.chunks):
        start = index * m  # brute force: chunk i is tokens[i*m : (i+1)*m], then the next c tokens
        assert chunk.chunk_index == index and chunk.doc_id == "d"
        assert list(chunk.tokens) == tokens[start:start + m]
        assert list(chunk.continuation) == tokens[start + m:start + m + c]
        assert len(chunk.tokens) == m or index == len(document.chunks) - 1


def test_document_tokens_follow_block_index_and_refuse_duplicates():
    assert retro_chunks.document_tokens([(2, [7, 8]), (0, [1]), (1, [4, 5, 6])]) == [1, 4, 5, 6, 7, 8]
    with pytest.raises(retro_chunks.DuplicateBlockIndexError, match=r"\[0, 1, 1\]"):
        retro_chunks.document_tokens([(1, [1]), (0, [2]), (1, [3])])
    with pytest.raises(ValueError):
        retro_chunks.chunk_document("d", [1, 2], 0, 1)


def test_chunk_record_round_trips_through_the_chunk_schema():
    chunk = retro_chunks.Chunk(doc_id="doc-7", chunk_index=3, tokens=(5, 6, 7), continuation=(8,))
    parsed = tf.io.parse_single_example(retro_chunks.chunk_to_example((41, chunk)),
                                        example_schemas.chunk_feature_spec())
    assert int(parsed[example_schemas.CHUNK_ID]) == 41 and int(parsed[example_schemas.CHUNK_INDEX]) == 3
    assert parsed[example_schemas.DOC_ID].numpy() == b"doc-7"
    assert parsed[example_schemas.TOKENS].numpy().tolist() == [5, 6, 7]
    assert parsed[example_schemas.CONTINUATION].numpy().tolist() == [8]
