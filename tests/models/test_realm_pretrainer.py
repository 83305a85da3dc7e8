"""REALM pretrainer: per-candidate outputs match separate calls; one step's gradients reach all three BERTs."""
import numpy as np
import tensorflow as tf

from realm_tf import config
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_augmented_encoder
from realm_tf.models import knowledge_retriever
from realm_tf.models import realm_pretrainer
from realm_tf.tasks import realm_loss


def _inputs(cfg, tok):
    rows = tok(tf.constant(["the 1973 oil crisis began in october 1973 when opec proclaimed an embargo",
                            "who wrote he ain't heavy"])).to_list()
    rows[0][6] = tok.mask_id  # "october"
    rows[1][2] = tok.mask_id  # "he"
    ids = tf.ragged.constant(rows, dtype=tf.int32)
    titles = [["", "1973 oil crisis", "Kenya"], ["", "He Ain't Heavy", "Syndactyly"]]  # candidate 0: null doc
    bodies = [["", "The crisis began in October 1973.", "Kenya is a country."],
              ["", "Written by Bob Russell and Bobby Scott.", "Webbed toes."]]
    flat_t, flat_b = tok(tf.constant(sum(titles, []))), tok(tf.constant(sum(bodies, [])))
    cands = tok.join_bert(flat_t, flat_b, cfg.model.block_seq_length)
    query_ids = tf.gather(ids, [0, 0, 0, 1, 1, 1])
    reader = tok.join_bert(query_ids, flat_b, cfg.model.reader_seq_length)
    packed_q = tok.pack_single(ids, cfg.model.query_seq_length)
    positions = tf.constant([[7, 1], [3, 3]], tf.int32)  # 1 + index of [MASK] in x (second row padded)
    inputs = {**{"query_" + k: v for k, v in packed_q.items()},
              **{"candidates_" + k: tf.reshape(v, [2, 3, -1]) for k, v in cands.items()},
              **{"reader_" + k: tf.reshape(v, [2, 3, -1]) for k, v in reader.items()},
              "masked_positions": positions}
    return inputs


def test_outputs_and_gradients_reach_every_tower():
    cfg = config.load_config("configs/tiny.yaml")
    tok = bert_tokenizer.BertTokenizer(cfg.model.vocab_file)
    model = realm_pretrainer.RealmPretrainer(knowledge_retriever.build_knowledge_retriever(cfg.model),
                                             knowledge_augmented_encoder.build_knowledge_augmented_encoder(cfg.model))
    inputs = _inputs(cfg, tok)
    assert inputs["reader_input_word_ids"].numpy()[0, 0, 7] == tok.mask_id
    with tf.GradientTape() as tape:
        out = model(inputs, training=True)
        loss = tf.reduce_mean(realm_loss.realm_marginal_loss(
            out["retrieval_logits"], out["mlm_logits"], [[tok.token_id("october"), 0], [tok.token_id("he")] * 2],
            [[1.0, 0.0], [1.0, 0.0]])["loss"])
    assert out["mlm_logits"].shape == (2, 3, 2, cfg.model.encoder.vocab_size)
    # Candidate 1 of query 0 equals the encoder and retriever called on their own.
    single = model.encoder({**{k: inputs["reader_" + k][0] for k in ("input_word_ids", "input_mask", "input_type_ids")},
                            "masked_positions": tf.tile(inputs["masked_positions"][:1], [3, 1])})["mlm_logits"]
    np.testing.assert_allclose(out["mlm_logits"].numpy()[0], single.numpy(), atol=1e-4)
    q = model.retriever.embed_queries({k: inputs["query_" + k] for k in ("input_word_ids", "input_mask",
                                                                           "input_type_ids")})
    d = model.retriever.embed_blocks({k: inputs["candidates_" + k][0] for k in ("input_word_ids", "input_mask",
                                                                                  "input_type_ids")})
    np.testing.assert_allclose(out["retrieval_logits"].numpy()[0], d.numpy() @ q.numpy()[0], atol=1e-4)
    grads = tape.gradient(loss, model.trainable_variables)
    nonzero = {v.name for v, g in zip(model.trainable_variables, grads)
               if g is not None and float(tf.reduce_sum(tf.abs(tf.convert_to_tensor(g)))) > 0}
    for tower in ("query_embedder/", "doc_embedder/", "reader_bert/"):
        assert any(tower in n and "transformer/layer_0" in n for n in nonzero), tower


def _loss_and_gradients(cfg, tok, weights=None):
    model = realm_pretrainer.RealmPretrainer(knowledge_retriever.build_knowledge_retriever(cfg.model),
                                             knowledge_augmented_encoder.build_knowledge_augmented_encoder(cfg.model))
    if weights is not None:
        model.set_weights(weights)
    inputs = _inputs(cfg, tok)
    with tf.GradientTape() as tape:
        out = model(inputs, training=False)
        loss = tf.reduce_mean(realm_loss.realm_marginal_loss(
            out["retrieval_logits"], out["mlm_logits"], [[tok.token_id("october"), 0], [tok.token_id("he")] * 2],
            [[1.0, 0.0], [1.0, 0.0]])["loss"])
    grads = tape.gradient(loss, model.trainable_variables)
    return model, inputs, out, loss.numpy(), {v.name: tf.convert_to_tensor(g).numpy()
                                              for v, g in zip(model.trainable_variables, grads) if g is not None}


def test_length_buckets_change_neither_outputs_nor_gradients():
    """Issue #20: the reader and the candidates' re-embedding read rows in length groups (less padding); one
    group (every row padded to the longest) is the reference, for the logits, the loss and every gradient."""
    tok = bert_tokenizer.BertTokenizer(config.load_config("configs/tiny.yaml").model.vocab_file)
    one = config.load_config("configs/tiny.yaml", ["model.reader_length_buckets=1", "model.candidate_length_buckets=1"])
    three = config.load_config("configs/tiny.yaml",
                               ["model.reader_length_buckets=3", "model.candidate_length_buckets=3"])
    model, inputs, out_one, loss_one, grads_one = _loss_and_gradients(one, tok)
    assert model.encoder.get_config()["length_buckets"] == 1
    _, _, out_three, loss_three, grads_three = _loss_and_gradients(three, tok, model.get_weights())
    lengths = inputs["reader_input_mask"].numpy().reshape(6, -1).sum(-1)
    assert len(set(lengths.tolist())) >= 4  # the 6 rows differ in length, so the groups are cut differently
    assert len(set(inputs["candidates_input_mask"].numpy().reshape(6, -1).sum(-1).tolist())) >= 4
    np.testing.assert_allclose(out_three["mlm_logits"].numpy(), out_one["mlm_logits"].numpy(), atol=1e-4)
    np.testing.assert_allclose(out_three["retrieval_logits"].numpy(), out_one["retrieval_logits"].numpy(), atol=1e-4)
    np.testing.assert_allclose(loss_three, loss_one, rtol=1e-5)
    assert grads_one.keys() == grads_three.keys() and len(grads_one) > 50
    # Float rounding, measured against the whole gradient's norm: a variable whose gradient nearly cancels (the
    # query tower's, reached through p(z|x) alone) has a tiny norm of its own. A row read out of order would move
    # the gradients by a share of order 1.
    scale = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads_one.values()))
    for name, grad in grads_one.items():
        assert np.linalg.norm(grads_three[name] - grad) < 1e-4 * scale, name
