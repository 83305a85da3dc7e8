"""Warm starts between REALM's stages: the retriever and reader BERT read back from ICT, REALM pre-training and
Open-QA fine-tuning checkpoints (run directories or prefixes) equal the weights that were saved."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import config
from realm_tf import errors
from realm_tf.core import warm_start
from realm_tf.models import knowledge_augmented_encoder
from realm_tf.models import knowledge_retriever
from realm_tf.models import realm_pretrainer
from realm_tf.models import span_reader
from realm_tf.tasks import realm_pretraining

CFG = config.load_config("configs/tiny.yaml")


def _perturb(layer: tf.Module, seed: int) -> None:
    for i, v in enumerate(layer.trainable_variables):
        v.assign_add(tf.random.stateless_normal(v.shape, seed=[seed, i], dtype=v.dtype))


def _assert_same(a: tf.Module, b: tf.Module) -> None:
    assert len(a.trainable_variables) == len(b.trainable_variables) > 0
    for x, y in zip(a.trainable_variables, b.trainable_variables):
        np.testing.assert_array_equal(x.numpy(), y.numpy(), err_msg=x.name)


def _retriever() -> knowledge_retriever.KnowledgeRetriever:
    return knowledge_retriever.build_knowledge_retriever(CFG.model)


def test_ict_run_directory_and_prefix(tmp_path):
    trained = _retriever()
    _perturb(trained, 1)
    prefix = tf.train.Checkpoint(model=trained).save(str(tmp_path / "ict" / "checkpoints" / "ckpt"))
    for source in (str(tmp_path / "ict"), prefix):
        fresh = _retriever()
        assert warm_start.restore_from_run(source, retriever=fresh) == prefix
        _assert_same(trained, fresh)
    with pytest.raises(errors.UserError, match="an ICT checkpoint has no reader"):
        warm_start.restore_from_run(prefix, reader_bert=span_reader.build_span_reader(CFG.model).encoder)


def test_realm_pretraining_starts_its_retriever_from_ict(tmp_path):
    trained = _retriever()
    _perturb(trained, 2)
    tf.train.Checkpoint(model=trained).save(str(tmp_path / "ict" / "checkpoints" / "ckpt"))
    cfg = config.load_config("configs/tiny.yaml", [f"model.retriever_checkpoint={tmp_path}/ict"])
    model = realm_pretraining.RealmPretrainingTask(cfg).build_model()
    _assert_same(trained, model.retriever)


def test_open_qa_starts_from_a_realm_run_and_from_a_finetuning_run(tmp_path):
    pretrained = realm_pretrainer.RealmPretrainer(
        _retriever(), knowledge_augmented_encoder.build_knowledge_augmented_encoder(CFG.model))
    _perturb(pretrained.retriever, 3)
    _perturb(pretrained.encoder.encoder, 4)
    tf.train.Checkpoint(model=pretrained).save(str(tmp_path / "realm" / "checkpoints" / "ckpt"))
    retriever, reader = _retriever(), span_reader.build_span_reader(CFG.model)
    warm_start.restore_from_run(str(tmp_path / "realm"), retriever=retriever, reader_bert=reader.encoder)
    _assert_same(pretrained.retriever, retriever)
    _assert_same(pretrained.encoder.encoder, reader.encoder)

    _perturb(retriever, 5)
    _perturb(reader.encoder, 6)
    tf.train.Checkpoint(retriever=retriever, reader=reader).save(str(tmp_path / "qa" / "checkpoints" / "ckpt"))
    again, again_reader = _retriever(), span_reader.build_span_reader(CFG.model)
    warm_start.restore_from_run(str(tmp_path / "qa"), retriever=again, reader_bert=again_reader.encoder)
    _assert_same(retriever, again)
    _assert_same(reader.encoder, again_reader.encoder)


def test_a_missing_run_is_a_clear_error(tmp_path):
    with pytest.raises(errors.UserError, match="no checkpoint to start from"):
        warm_start.restore_from_run(str(tmp_path / "nothing"), retriever=_retriever())
