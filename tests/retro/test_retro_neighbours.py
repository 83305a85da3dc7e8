"""RETRO's neighbours per chunk (Borgeaud et al., 2021, §2.3): the nearest database chunks by the frozen BERT's
keys, with the training sequence's own document excluded, read as r-token values."""
import numpy as np

from realm_tf import config
from realm_tf.index import brute_force_index
from realm_tf.retro import chunk_key_embedder
from realm_tf.retro import chunk_store
from realm_tf.retro import retro_chunks
from realm_tf.retro import retro_neighbours


def test_own_document_excluded_in_training_and_found_otherwise(tiny_bert_checkpoint):
    cfg = config.load_config("configs/tiny.yaml", [f"retro.embedder_checkpoint={tiny_bert_checkpoint}",
                                                   "retro.chunk_length=4", "retro.continuation_length=2",
                                                   "retro.num_neighbours=2"])
    rng = np.random.default_rng(0)
    documents = {f"doc{d}": rng.integers(1000, 9000, size=int(rng.integers(9, 20))).tolist() for d in range(6)}
    chunks = [c for d, t in documents.items() for c in retro_chunks.chunk_document(d, t, 4, 2).chunks]
    store = chunk_store.ChunkStore([c.tokens for c in chunks], [c.continuation for c in chunks],
                                   [c.doc_id for c in chunks])
    embedder = chunk_key_embedder.build_chunk_key_embedder(cfg)
    keys = embedder(chunk_key_embedder.pack_chunks([list(c.tokens) for c in chunks], 101, 102)).numpy()
    index = brute_force_index.BruteForceIndex()
    index.build(keys)
    retriever = retro_neighbours.RetroNeighbourRetriever(cfg, store, index, embedder, 101, 102, candidates=len(chunks))
    sequence = np.array(documents["doc2"][:8])  # two whole chunks of doc2
    own = store.document_of("doc2")

    training = retriever.neighbours(sequence, "doc2")
    assert training.chunk_ids.shape == (2, 2) and training.tokens.shape == training.mask.shape == (2, 2, 6)
    assert (training.chunk_ids >= 0).all() and (store.doc_index[training.chunk_ids] != own).all()
    # brute force: the two best-scoring chunks of other documents, by the inner product of the keys
    query = embedder(chunk_key_embedder.pack_chunks(sequence.reshape(2, 4).tolist(), 101, 102)).numpy()
    for c in range(2):
        scores = keys @ query[c]
        ranked = [int(i) for i in np.argsort(-scores, kind="stable") if store.doc_index[i] != own]
        assert training.chunk_ids[c].tolist() == ranked[:2]
        for j, chunk_id in enumerate(training.chunk_ids[c]):
            value = (list(chunks[chunk_id].tokens) + list(chunks[chunk_id].continuation))[:6]
            assert training.tokens[c, j, :len(value)].tolist() == value and training.mask[c, j].sum() == len(value)

    evaluation = retriever.neighbours(sequence, "doc2", exclude_own_document=False)
    # without the exclusion a chunk of the database is its own nearest neighbour
    first_chunks = [i for i, c in enumerate(chunks) if c.doc_id == "doc2"][:2]
    assert evaluation.chunk_ids[:, 0].tolist() == first_chunks
    assert retriever.neighbours(sequence[:3], "doc2").chunk_ids.shape == (0, 2)  # no whole chunk, no neighbours
