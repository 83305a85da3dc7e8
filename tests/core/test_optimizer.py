"""AdamW with per-variable learning-rate scales vs a numpy AdamW step, and the plain optimizer unchanged."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf
import tf_keras
from official.modeling.optimization import legacy_adamw

from realm_tf import config
from realm_tf.core import optimizer as optimizer_lib

BASE = dataclasses.replace(config.TrainerConfig(), learning_rate=1e-2, warmup_steps=0, steps=100, weight_decay=0.1,
                           clip_norm=100.0)


def _variables():
    rng = np.random.default_rng(0)
    return {name: tf.Variable(rng.normal(size=[3, 2]).astype(np.float32), name=name)
            for name in ("head/kernel", "retriever/kernel", "encoder/kernel", "encoder/bias")}


def _numpy_adamw_first_step(w, g, lr, decay):
    # Legacy Adam at t = 1: lr * sqrt(1 - b2) / (1 - b1) * m / (sqrt(v) + eps), m = (1 - b1) g, v = (1 - b2) g²;
    # tf-models' AdamW first applies the decoupled decay w -= lr * rate * w.
    b1, b2, eps = 0.9, 0.999, 1e-7
    w = w - lr * decay * w
    m, v = (1 - b1) * g, (1 - b2) * g * g
    return w - lr * np.sqrt(1 - b2) / (1 - b1) * m / (np.sqrt(v) + eps)


def test_scaled_variables_take_scaled_steps_and_the_rest_plain_adamw():
    cfg = dataclasses.replace(BASE, learning_rate_scales=("head=10", "retriever=0.1", "kernel=2"))
    variables = _variables()
    start = {k: v.numpy() for k, v in variables.items()}
    grads = {k: tf.constant(np.random.default_rng(1).normal(size=[3, 2]).astype(np.float32) * 0.01) for k in variables}
    opt = optimizer_lib.build_optimizer(cfg)
    assert isinstance(opt, optimizer_lib.ScaledAdamWeightDecay)
    opt.apply_gradients([(grads[k], v) for k, v in variables.items()])
    # First match wins: head -> 10, retriever -> 0.1, encoder/kernel -> 2; encoder/bias unscaled, never decayed.
    for name, scale, decay in (("head/kernel", 10, 0.1), ("retriever/kernel", 0.1, 0.1), ("encoder/kernel", 2, 0.1),
                               ("encoder/bias", 1, 0.0)):
        expected = _numpy_adamw_first_step(start[name], grads[name].numpy(), 1e-2 * scale, decay)
        np.testing.assert_allclose(variables[name].numpy(), expected, rtol=1e-5, atol=1e-7, err_msg=name)


def test_without_scales_the_optimizer_is_tf_models_adamw_with_the_same_steps():
    plain, scaled = optimizer_lib.build_optimizer(BASE), optimizer_lib.build_optimizer(
        dataclasses.replace(BASE, learning_rate_scales=("nothing-matches=5",)))
    assert plain.get_config()["lr_scales"] == [] and plain.lr_scale("head/kernel") == 1.0
    a, b = _variables(), _variables()
    for step in range(3):
        grads = {k: tf.constant(np.random.default_rng(step).normal(size=[3, 2]).astype(np.float32)) for k in a}
        plain.apply_gradients([(grads[k], v) for k, v in a.items()])
        scaled.apply_gradients([(grads[k], v) for k, v in b.items()])
    for k in a:
        np.testing.assert_allclose(a[k].numpy(), b[k].numpy(), rtol=1e-6, err_msg=k)
    assert scaled.get_config()["lr_scales"] == [["nothing-matches", 5.0]]


def _numpy_adamw_steps(w, grads, lr, decay, steps, clip_norm):
    """Legacy Adam + tf-models' decoupled decay over ``grads`` (a list of ``{name: gradient}``), each step's gradients
    clipped to the global norm ``clip_norm``, with BASE's schedule (no warm-up, linear decay to 0 over ``steps``)."""
    b1, b2, eps = 0.9, 0.999, 1e-7
    w = {k: v.astype(np.float64) for k, v in w.items()}
    m = {k: np.zeros_like(v) for k, v in w.items()}
    v2 = {k: np.zeros_like(v) for k, v in w.items()}
    for t, g in enumerate(grads, start=1):
        norm = np.sqrt(sum(np.sum(x.astype(np.float64) ** 2) for x in g.values()))
        scale = min(1.0, clip_norm / norm)
        lr_t = lr * (1 - (t - 1) / steps)
        for k in w:
            w[k] = w[k] - lr_t * decay * w[k]
            m[k] = b1 * m[k] + (1 - b1) * scale * g[k]
            v2[k] = b2 * v2[k] + (1 - b2) * (scale * g[k]) ** 2
            w[k] = w[k] - lr_t * np.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m[k] / (np.sqrt(v2[k]) + eps)
    return w


@pytest.mark.parametrize("clip_norm", [100.0, 1.0])
def test_gradients_are_clipped_once_to_the_configured_global_norm(clip_norm):
    """``pretrain.clip_norm`` is the one clip: tf-models' AdamWeightDecay has its own (``gradient_clip_norm``, 1.0 by
    default), which would otherwise clip every gradient to norm 1 whatever the config says. Two steps with
    global norms 50 and 400: Adam's step is scale-free only at t = 1, so the second step shows any clip."""
    cfg = dataclasses.replace(BASE, clip_norm=clip_norm, weight_decay=0.0)
    variables = _variables()
    start = {k: v.numpy() for k, v in variables.items()}
    rng = np.random.default_rng(3)
    grads = []
    for norm in (50.0, 400.0):
        g = {k: rng.normal(size=[3, 2]).astype(np.float32) for k in variables}
        total = np.sqrt(sum(np.sum(x ** 2) for x in g.values()))
        grads.append({k: x * np.float32(norm / total) for k, x in g.items()})
    opt = optimizer_lib.build_optimizer(cfg)
    for g in grads:
        opt.apply_gradients([(tf.constant(g[k]), v) for k, v in variables.items()])
    expected = _numpy_adamw_steps(start, grads, 1e-2, 0.0, BASE.steps, clip_norm)
    for k, v in variables.items():
        np.testing.assert_allclose(v.numpy(), expected[k], rtol=1e-5, atol=1e-6, err_msg=k)


@pytest.mark.parametrize("item, message", [("masked_lm", "expected REGEX=SCALE"), ("=3", "expected REGEX=SCALE"),
                                           ("head=-1", "must be >= 0"), ("head=fast", "could not convert"),
                                           ("[head=2", "unterminated character set")])
def test_malformed_scales_name_the_item(item, message):
    with pytest.raises(config.ConfigError, match=message):
        optimizer_lib.build_optimizer(dataclasses.replace(BASE, learning_rate_scales=(item,)))


def test_scales_load_from_yaml_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("pretrain:\n  learning_rate_scales: ['masked_lm=10', 'knowledge_retriever=0.1']\n")
    assert config.load_config(str(path)).pretrain.learning_rate_scales == ("masked_lm=10", "knowledge_retriever=0.1")
    cfg = config.load_config(str(path), ["pretrain.learning_rate_scales=[masked_lm=3]"])
    assert cfg.pretrain.learning_rate_scales == ("masked_lm=3",)


def test_a_plain_adamw_checkpoint_resumes_into_the_scaled_optimizer(tmp_path):
    """Adding scales to a running experiment keeps its moments and step count (same checkpoint layout)."""
    variables = _variables()
    plain = optimizer_lib.build_optimizer(BASE)
    for step in range(2):
        plain.apply_gradients([(tf.fill(v.shape, 0.1 * (step + 1)), v) for v in variables.values()])
    prefix = tf.train.Checkpoint(optimizer=plain, **{k.replace("/", "_"): v for k, v in variables.items()}).save(
        str(tmp_path / "ckpt"))
    fresh = {k: tf.Variable(tf.zeros_like(v), name=k) for k, v in variables.items()}
    scaled = optimizer_lib.build_optimizer(dataclasses.replace(BASE, learning_rate_scales=("head=10",)))
    tf.train.Checkpoint(optimizer=scaled, **{k.replace("/", "_"): v for k, v in fresh.items()}).read(
        prefix).assert_existing_objects_matched()
    scaled.apply_gradients([(tf.zeros_like(v), v) for v in fresh.values()])  # creates the slots (restored lazily)
    assert int(scaled.iterations) == 3
    for k in variables:
        np.testing.assert_allclose(scaled.get_slot(fresh[k], "m").numpy(),
                                   plain.get_slot(variables[k], "m").numpy() * 0.9, rtol=1e-6, err_msg=k)


class _Component(tf_keras.layers.Layer):
    def __init__(self, inner, **kwargs):
        super().__init__(**kwargs)
        self.inner = inner

    def call(self, x):
        return self.inner(x)


class _Model(tf_keras.Model):
    def __init__(self, retriever, reader, **kwargs):
        super().__init__(**kwargs)
        self.retriever, self.reader = retriever, reader

    def call(self, ids):
        return self.retriever(ids) + self.reader(ids)


def test_scales_follow_the_component_even_when_variables_were_built_outside_it():
    """An encoder restored from an import is built on its own, so its variables are not named after the
    component that holds it (the MiniLM retriever's were ``query_embedder_bert/...``); scales still apply."""
    outside = tf_keras.layers.Embedding(50, 4, name="query_embedder_bert")
    outside(tf.constant([[1]]))  # built before it is wrapped, as bert_weight_import does
    model = _Model(_Component(outside, name="knowledge_retriever"),
                   _Component(tf_keras.layers.Embedding(50, 4, name="reader_bert"), name="reader"))
    model(tf.constant([[1, 2]]))
    assert not any("knowledge_retriever" in v.name for v in model.retriever.trainable_variables)
    paths = optimizer_lib.variable_paths(model)
    assert paths[outside.embeddings.name] == f"knowledge_retriever/{outside.embeddings.name}"
    cfg = dataclasses.replace(BASE, weight_decay=0.0, learning_rate_scales=("knowledge_retriever=0.1",))
    opt = optimizer_lib.build_optimizer(cfg, model)
    start = [v.numpy().copy() for v in (model.retriever.inner.embeddings, model.reader.inner.embeddings)]
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(model(tf.constant([[1, 2]])) * tf.constant([[[1.0, -2.0, 3.0, 0.5]]]))
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(isinstance(g, tf.IndexedSlices) for g in grads)  # the sparse update path (embedding rows)
    opt.apply_gradients(zip(grads, model.trainable_variables))
    for variable, before, scale in zip((model.retriever.inner.embeddings, model.reader.inner.embeddings), start,
                                       (0.1, 1.0)):
        dense = np.zeros_like(before)
        dense[[1, 2]] = [[1.0, -2.0, 3.0, 0.5]] * 2
        expected = before.copy()
        rows = [1, 2]
        expected[rows] = _numpy_adamw_first_step(before[rows], dense[rows], 1e-2 * scale, 0.0)
        # The sparse path places Adam's epsilon slightly differently (~1e-6 of a step of 1e-2 * scale).
        np.testing.assert_allclose(variable.numpy(), expected, rtol=0, atol=1e-6, err_msg=variable.name)


@pytest.mark.parametrize("decay", ["linear", "constant", "cooldown"])
def test_learning_rate_warms_up_then_decays_linearly_or_stays(decay):
    cfg = config.TrainerConfig(learning_rate=1e-3, warmup_steps=4, steps=20, learning_rate_decay=decay,
                               cooldown_steps=8)
    optimizer = optimizer_lib.build_optimizer(cfg)
    schedule = optimizer.learning_rate
    rates = np.array([float(schedule(step)) for step in range(0, 30, 2)])  # steps 0, 2, ..., 28
    steps = np.arange(0, 30, 2)
    if decay == "linear":  # tf-models: warm-up to the decayed value at that step, decay to 0 at ``steps``
        expected = np.where(steps < 4, 1e-3 * (1 - 4 / 20) * steps / 4, 1e-3 * np.maximum(1 - steps / 20, 0))
    elif decay == "cooldown":  # constant to step 12, then linear to 0 at step 20 (the last 8 steps)
        expected = np.where(steps < 4, 1e-3 * steps / 4, 1e-3 * np.clip((20 - steps) / 8, 0, 1))
    else:
        expected = np.where(steps < 4, 1e-3 * steps / 4, 1e-3)
    np.testing.assert_allclose(rates, expected, rtol=1e-5, atol=1e-9)


def test_a_cooldown_longer_than_the_run_is_a_config_error_naming_the_key(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("reader:\n  steps: 100\n  learning_rate_decay: cooldown\n  cooldown_steps: 200\n")
    with pytest.raises(config.ConfigError, match=r"run.yaml:4: reader.learning_rate_decay=cooldown needs 1 <= "
                                                 r"reader.cooldown_steps <= reader.steps, got 200 and 100"):
        config.load_config(str(path))
    assert config.load_config(str(path), ["reader.cooldown_steps=100"]).reader.cooldown_steps == 100


def test_no_normalisation_scale_or_bias_is_decayed_in_any_model():
    """AdamW's weight decay applies to weight matrices and embeddings only: not to a LayerNorm of BERT, nor to
    RETRO's attention_norm / cca_norm / output_norm, nor to any bias."""
    from realm_tf.retro import retro_decoder  # pylint: disable=import-outside-toplevel
    from realm_tf.tasks import realm_pretraining  # pylint: disable=import-outside-toplevel

    cfg = config.load_config("configs/tiny.yaml")
    optimizer = optimizer_lib.build_optimizer(BASE)
    decoder = retro_decoder.build_retro_decoder(cfg)
    n, m = cfg.retro.sequence_length, cfg.retro.chunk_length
    k, r = cfg.retro.num_neighbours, cfg.retro.chunk_length + cfg.retro.continuation_length
    decoder({"input_ids": tf.zeros([1, n], tf.int32), "neighbour_ids": tf.zeros([1, n // m, k, r], tf.int32),
             "neighbour_mask": tf.ones([1, n // m, k, r], tf.bool)})
    names = [v.name for v in decoder.weights + realm_pretraining.RealmPretrainingTask(cfg).build_model().weights]
    decayed = {name for name in names if optimizer._do_use_weight_decay(name)}  # noqa: SLF001  (the rule itself)
    norms = {name for name in names if "norm" in name.lower() and "kernel" not in name}
    assert norms and not decayed & norms, sorted(decayed & norms)
    assert not {name for name in decayed if name.endswith("bias:0")}
    assert any("cca_norm" in name for name in norms) and any("kernel" in name for name in decayed)


def test_embedding_rows_are_applied_as_the_dense_gradient_they_stand_for():
    """A word-embedding table's gradient (``tf.IndexedSlices``, a row twice) takes the steps tf-models' AdamW takes
    with its sparse update, and those of the same gradient given densely; the table is never scattered into."""
    rng = np.random.default_rng(5)
    start = rng.normal(size=[50, 4]).astype(np.float32)
    ours, dense_ours = optimizer_lib.build_optimizer(BASE), optimizer_lib.build_optimizer(BASE)
    theirs = legacy_adamw.AdamWeightDecay(
        learning_rate=tf_keras.optimizers.schedules.PolynomialDecay(1e-2, BASE.steps, 0.0), weight_decay_rate=0.1,
        exclude_from_weight_decay=list(optimizer_lib.NO_WEIGHT_DECAY), gradient_clip_norm=0.0)
    tables = [tf.Variable(start, name="word_embeddings/embeddings") for _ in range(3)]
    for _ in range(3):
        indices = np.append(rng.choice(50, size=11, replace=False), 7)  # row 7 twice at most
        values = rng.normal(size=[12, 4]).astype(np.float32)
        dense = np.zeros_like(start)
        np.add.at(dense, indices, values)
        rows = tf.IndexedSlices(tf.constant(values), tf.constant(indices, tf.int64), tf.constant([50, 4], tf.int64))
        ours.apply_gradients([(rows, tables[0])])
        theirs.apply_gradients([(rows, tables[1])])
        dense_ours.apply_gradients([(tf.constant(dense), tables[2])])
    np.testing.assert_allclose(tables[0].numpy(), tables[1].numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(tables[0].numpy(), tables[2].numpy(), rtol=1e-6, atol=1e-7)
    assert np.abs(tables[0].numpy() - start).min() > 0  # rows without a gradient moved too, as Adam's do

    @tf.function
    def step(gradient):
        ours.apply_gradients([(gradient, tables[0])])

    rows = tf.IndexedSlices(tf.constant(values), tf.constant(indices, tf.int64), tf.constant([50, 4], tf.int64))
    types = {op.type for op in step.get_concrete_function(rows).graph.get_operations()}
    assert "ResourceApplyAdam" in types and not {t for t in types if "Scatter" in t}
