"""RETRO language modelling on the tiny workspace: the chunk database, sequences with neighbours from other
documents only, the next-token loss against numpy, training the baseline, RETRO and a RETRO-fit."""
import numpy as np
import pytest
import tensorflow as tf

from realm_tf import cli
from realm_tf import config
from realm_tf.data import retro_sequences
from realm_tf.tasks import retro_lm

TINY = "configs/tiny.yaml"


@pytest.fixture(scope="module")
def retro_sets(tmp_path_factory, pretraining_workspace, tiny_bert_checkpoint):
    root = tmp_path_factory.mktemp("retro")
    sets = [f"data.blocks_dir={pretraining_workspace}/blocks", f"retro.chunks_dir={root}/chunks",
            f"retro.index_dir={root}/index", "index.kind=brute_force",
            f"retro.embedder_checkpoint={tiny_bert_checkpoint}", "retro.chunk_length=8", "retro.continuation_length=8",
            "retro.sequence_length=32", "retro.num_neighbours=2", "retro.decoder_layers=2", "retro.decoder_width=16",
            "retro.decoder_heads=2", "retro.decoder_intermediate=32",
            "retro.dropout_rate=0.0", "retro.validation_fraction=0.2", "retro.test_fraction=0.1", "data.batch_size=2",
            "data.shuffle_buffer=8", "retro_trainer.steps=3", "retro_trainer.warmup_steps=0",
            "retro_trainer.summary_every_steps=1", "retro_trainer.checkpoint_every_steps=3"]
    assert cli.main(["build-chunk-database", "--config", TINY, *sum((["--set", s] for s in sets), [])]) == 0
    return root, sets


def test_training_sequences_come_from_training_documents_with_neighbours_from_others(retro_sets):
    _, sets = retro_sets
    task = retro_lm.RetroLmTask(config.load_config(TINY, sets))
    splits = {d: retro_sequences.document_split(d, 0.2, 0.1) for d in set(task.store.doc_ids)}
    assert {"train", "validation"} <= set(splits.values())
    train_docs = task.documents("train")
    assert train_docs and all(splits[d] == "train" for d, _ in train_docs)
    examples = list(task.examples("train"))
    assert len(examples) == sum(-(-len(s) // 32) for _, s in train_docs)
    stream = dict(train_docs)[train_docs[0][0]]
    first = examples[0]
    assert first["input_ids"][:first["input_mask"].sum()].tolist() == stream[:32].tolist()[:first["input_mask"].sum()]
    assert first["targets"][:-1].tolist() == first["input_ids"][1:].tolist()
    assert first["neighbour_ids"].shape == (4, 2, 16)
    # the chunk database's chunks of that sequence's document are never its neighbours
    own = task.store.document_of(train_docs[0][0])
    sources = [d for d, s in train_docs for _ in range(-(-len(s) // 32))]
    for example, doc_id in list(zip(examples, sources))[:6]:
        chunk_ids = task.retriever.neighbours(example["input_ids"], doc_id).chunk_ids
        assert (task.store.doc_index[chunk_ids[chunk_ids >= 0]] != task.store.document_of(doc_id)).all()
    assert own >= 0


def test_loss_is_the_mean_next_token_nll_over_real_tokens():
    task = retro_lm.RetroLmTask(config.load_config(TINY))
    rng = np.random.default_rng(0)
    logits = rng.normal(size=[2, 5, 7]).astype(np.float32)
    targets = rng.integers(0, 7, size=[2, 5]).astype(np.int32)
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    per_example, terms = task.build_losses({"targets": targets, "target_mask": mask}, {"logits": logits})
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, targets[..., None], -1)[..., 0]  # [2, 5]
    np.testing.assert_allclose(per_example.numpy(), (nll * mask).sum(1) / mask.sum(1), rtol=1e-5)
    np.testing.assert_allclose(terms["tokens"].numpy(), [3, 5])


def test_baseline_then_retro_fit_trains_only_the_retro_layers(retro_sets, read_scalars):
    root, sets = retro_sets
    base = sets + [f"retro_trainer.model_dir={root}/baseline"]
    assert cli.main(["train-retro", "--config", TINY, "--baseline", *sum((["--set", s] for s in base), [])]) == 0
    assert tf.train.latest_checkpoint(str(root / "baseline" / "checkpoints")).endswith("-3")
    losses = [v for _, v in read_scalars(root / "baseline" / "train")["loss"]]
    assert len(losses) == 3 and all(np.isfinite(losses))

    fit = sets + [f"retro_trainer.model_dir={root}/fit", f"retro.retro_fit_from={root}/baseline"]
    assert cli.main(["train-retro", "--config", TINY, *sum((["--set", s] for s in fit), [])]) == 0
    baseline_values = dict(tf.train.list_variables(tf.train.latest_checkpoint(str(root / "baseline" / "checkpoints"))))
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(root / "fit" / "checkpoints")))
    before = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(root / "baseline" / "checkpoints")))
    shared = [n for n in baseline_values if n.startswith("model/") and "OPTIMIZER_SLOT" not in n
              and reader.has_tensor(n)]
    assert shared  # the decoder's own weights: copied from the baseline and left alone
    for name in shared:
        np.testing.assert_array_equal(reader.get_tensor(name), before.get_tensor(name))
    fitted = [n for n, _ in tf.train.list_variables(tf.train.latest_checkpoint(str(root / "fit" / "checkpoints")))
              if "cca" in n and "OPTIMIZER_SLOT" not in n]
    assert fitted  # the RETRO layers exist and were trained
