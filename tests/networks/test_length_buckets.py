"""BERT read in length groups and as XLA programs (``model.compiled_inference``): the same outputs as one plain
call, a bounded number of compiled programs, and compiled programs that survive a SavedModel export."""
import gc
import weakref

import numpy as np
import pytest
import tensorflow as tf
import tf_keras

from realm_tf import config
from realm_tf.models import knowledge_retriever
from realm_tf.models import span_reader
from realm_tf.networks import bert_encoder
from realm_tf.networks import length_buckets


@pytest.fixture(scope="module")
def tiny_encoder():
    return bert_encoder.build_bert_encoder(config.load_config("configs/tiny.yaml").model.encoder)


def _ragged_inputs(lengths, seq_len, seed=0):
    """Packed rows whose first ``lengths[i]`` positions are real (mask 1), zeros after."""
    rng = np.random.default_rng(seed)
    ids = np.zeros([len(lengths), seq_len], np.int32)
    types = np.zeros_like(ids)
    for row, n in enumerate(lengths):
        ids[row, :n] = rng.integers(1000, 2000, n)
        types[row, n // 2:n] = 1
    return {"input_word_ids": tf.constant(ids), "input_mask": tf.constant((ids > 0).astype(np.int32)),
            "input_type_ids": tf.constant(types)}


def _real_positions(outputs, inputs):
    mask = inputs["input_mask"].numpy().astype(bool)
    return outputs["sequence_output"].numpy()[mask], outputs["pooled_output"].numpy()


@pytest.mark.parametrize("num_buckets", [1, 3])
def test_compiled_groups_match_one_plain_call(tiny_encoder, num_buckets):
    inputs = _ragged_inputs([5, 70, 33, 12, 64, 3, 40], seq_len=80)
    plain = tiny_encoder(inputs, training=False)
    compiled = tf.function(lambda x: length_buckets.encode(tiny_encoder, x, num_buckets, training=False,
                                                           compiled=True), autograph=False)(inputs)
    assert compiled["sequence_output"].shape == plain["sequence_output"].shape
    want_seq, want_pooled = _real_positions(plain, inputs)
    got_seq, got_pooled = _real_positions(compiled, inputs)
    np.testing.assert_allclose(got_seq, want_seq, atol=2e-5)
    np.testing.assert_allclose(got_pooled, want_pooled, atol=2e-5)
    # Positions past the longest row of a row's group are zeros, as in the uncompiled groups (the row of 3 is
    # grouped with 5 and 12 in three groups; with all seven, up to 70, in one).
    lengths = inputs["input_mask"].numpy().sum(-1)
    group_longest = {1: 70, 3: 12}[num_buckets]
    assert np.all(compiled["sequence_output"].numpy()[lengths == 3, group_longest:] == 0)
    assert np.all(compiled["sequence_output"].numpy()[lengths == 3, group_longest - 1] != 0)


def test_compiled_programs_are_one_per_rounded_length(tiny_encoder):
    function = length_buckets.compiled_forward(tiny_encoder)
    before = function.experimental_get_tracing_count()
    read = tf.function(lambda x: length_buckets.encode(tiny_encoder, x, 2, training=False, compiled=True),
                       autograph=False)
    for lengths in ([3, 9, 17, 30], [1, 2, 31, 32], [33, 40, 2, 5]):
        read(_ragged_inputs(lengths, seq_len=48))
    # One trace with unknown shapes serves every call; XLA compiles per shape at run time.
    assert function.experimental_get_tracing_count() - before <= 1
    assert length_buckets.compiled_forward(tiny_encoder) is function


def test_a_discarded_encoder_and_its_compiled_function_are_freed():
    encoder = bert_encoder.build_bert_encoder(config.load_config("configs/tiny.yaml").model.encoder)
    length_buckets.encode(encoder, _ragged_inputs([3, 7], seq_len=8), 1, training=False, compiled=True)
    assert encoder in length_buckets._COMPILED
    gone = weakref.ref(encoder)
    del encoder
    gc.collect()
    assert gone() is None  # e.g. the float32 copy of Embed_doc that open_qa.check_index_matches builds


class _Recording(tf_keras.layers.Layer):
    """``encoder``, noting the length of every batch it reads."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder
        self.lengths = []

    def call(self, inputs, training=None):
        self.lengths.append(int(inputs["input_word_ids"].shape[1]))
        return self.encoder(inputs, training=training)

    def get_config(self):
        return self.encoder.get_config()


@pytest.mark.parametrize("num_buckets", [1, 3])
def test_training_reads_lengths_in_multiples_of_32_with_the_same_outputs(tiny_encoder, num_buckets):
    inputs = _ragged_inputs([5, 70, 33, 12, 64, 3, 40], seq_len=70)
    recording = _Recording(tiny_encoder)
    trained = length_buckets.encode(recording, inputs, num_buckets, training=True)
    # One group: 70 -> 96. Three: [3, 5, 12] -> 32, [33, 40, 64] -> 64, [70] -> 96.
    assert recording.lengths == {1: [96], 3: [32, 64, 96]}[num_buckets]
    plain = tiny_encoder(inputs, training=False)  # the tiny config has no dropout: training pads, nothing else
    assert trained["sequence_output"].shape == plain["sequence_output"].shape
    want_seq, want_pooled = _real_positions(plain, inputs)
    got_seq, got_pooled = _real_positions(trained, inputs)
    np.testing.assert_allclose(got_seq, want_seq, atol=2e-5)
    np.testing.assert_allclose(got_pooled, want_pooled, atol=2e-5)


def test_rounded_length_stops_at_the_limit_but_never_cuts():
    got = [int(length_buckets.rounded_length(n, limit)) for n, limit in ((70, 512), (64, 512), (1, 512), (70, 80),
                                                                          (100, 80), (500, 512))]
    assert got == [96, 64, 32, 80, 100, 512]


def test_training_is_never_compiled(tiny_encoder):
    inputs = _ragged_inputs([4, 9], seq_len=12)
    with tf.GradientTape() as tape:
        out = length_buckets.encode(tiny_encoder, inputs, 1, training=True, compiled=True)
        loss = tf.reduce_sum(out["pooled_output"])
    grads = tape.gradient(loss, tiny_encoder.trainable_variables)
    assert any(g is not None for g in grads)


def test_compiled_span_reader_and_retriever_match_plain_and_export(tmp_path):
    cfg = config.load_config("configs/tiny.yaml", ["model.reader_length_buckets=2"])
    compiled_cfg = config.load_config("configs/tiny.yaml", ["model.reader_length_buckets=2",
                                                            "model.compiled_inference=true"])
    plain_reader = span_reader.build_span_reader(cfg.model)
    reader = span_reader.build_span_reader(compiled_cfg.model)
    reader.set_weights(plain_reader.get_weights())
    assert reader.get_config()["compiled_inference"] is True
    flat = _ragged_inputs([20, 7, 31, 12, 25, 9], seq_len=32, seed=1)
    inputs = {k: tf.reshape(v, [2, 3, 32]) for k, v in flat.items()}
    want, got = plain_reader(inputs, training=False), reader(inputs, training=False)
    valid = want["span_mask"].numpy()
    np.testing.assert_array_equal(got["span_mask"].numpy(), valid)
    np.testing.assert_allclose(got["span_logits"].numpy()[valid], want["span_logits"].numpy()[valid], atol=1e-4)

    plain_retriever = knowledge_retriever.build_knowledge_retriever(cfg.model)
    retriever = knowledge_retriever.build_knowledge_retriever(compiled_cfg.model)
    retriever.set_weights(plain_retriever.get_weights())
    want_emb = plain_retriever.embed_blocks(flat, training=False).numpy()
    np.testing.assert_allclose(retriever.embed_blocks(flat, training=False).numpy(), want_emb, atol=1e-5)

    class Served(tf.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        @tf.function(input_signature=[tf.TensorSpec([None, None], tf.int32, name=k)
                                      for k in bert_encoder.INPUT_KEYS], autograph=False)
        def embed(self, input_word_ids, input_mask, input_type_ids):
            return self.model.embed_blocks({"input_word_ids": input_word_ids, "input_mask": input_mask,
                                            "input_type_ids": input_type_ids}, training=False)

    path = str(tmp_path / "served")
    tf.saved_model.save(Served(retriever), path)
    loaded = tf.saved_model.load(path)
    graph = loaded.embed.get_concrete_function().graph.as_graph_def()
    assert any(f.attr["_XlaMustCompile"].b for f in graph.library.function)  # the program is in the export
    np.testing.assert_allclose(loaded.embed(**flat).numpy(), want_emb, atol=1e-5)
