"""``realm-tf import-realm``: Google's released REALM and ORQA models as runs of this code base.

REALM (Guu et al., 2020) released its pre-trained retriever and knowledge-augmented encoder as TF-Hub modules
(``gs://realm-data/cc_news_pretrained/{embedder,bert}``) and its Open-QA models fine-tuned with ORQA's code
(Lee et al., 2019; ``gs://realm-data/orqa_{nq,wq}_model_from_realm``), all TF1. Each kind becomes the run that
the matching stage here writes, so every later stage reads it as it reads its own:

* ``embedder`` (REALM's ``embedder``, ORQA's ICT module ``gs://orqa-data/ict``): a retriever run
  (``model = KnowledgeRetriever``, one tower for questions and blocks: REALM's ``share_embedders``), read by
  ``model.retriever_checkpoint`` / ``qa.retriever_checkpoint`` and ``export-retriever --model-dir``;
* ``bert`` (REALM's ``bert``: BERT and its MLM head): a REALM pre-training run's knowledge-augmented encoder
  (``model.encoder``), read by ``qa.reader_checkpoint``; REALM's fine-tuning recipe is exactly these two
  (``orqa_experiment --retriever_module_path=.../embedder --reader_module_path=.../bert``);
* ``openqa`` (a fine-tuned ORQA model): an Open-QA fine-tuning run (``retriever``, ``reader``) that
  ``realm-tf export`` / ``evaluate`` serve with ``finetune.model_dir`` = the output. Its query tower is the
  fine-tuned retriever module; its document tower is the retriever module that encoded the blocks (``--embedder``,
  by default ORQA's ``params.json`` ``retriever_module_path``), so the index and Embed_doc agree.

The output directory holds ``checkpoints/ckpt-0``, ``vocab.txt`` (the module's ``assets/vocab.txt``),
``params.yaml`` (the ``--config`` given, e.g. ``configs/base.yaml``, with the imported architecture: the tanh
GELU, the embedder's pooled output, ORQA's span LayerNorm and title-less reader input; and the paths below) and
``import.json`` (every variable assigned, and every one ignored with its reason; the marker of a complete
import, written last with every file's SHA-256: the run is written whole in a staging directory and published
at once, so a crash leaves nothing at the output and a rerun starts afresh). With ``--blocks``, ORQA's
corpus (``blocks.tfr``, ``titles.tfr`` next to it, and ``block_emb`` of ``<embedder>/encoded/encoded.ckpt``)
becomes ``blocks/`` and a published ``index/`` version (:mod:`realm_tf.release.corpus_import`), and
``params.yaml``'s ``data.blocks_dir`` / ``index.index_dir`` point there.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from typing import Any, Sequence

import tensorflow as tf

from realm_tf import artifacts
from realm_tf import config as config_lib
from realm_tf import errors
from realm_tf.core import warm_start
from realm_tf.layers import bert_tokenizer
from realm_tf.models import knowledge_augmented_encoder
from realm_tf.models import knowledge_retriever
from realm_tf.models import span_reader
from realm_tf.release import checkpoint_import as ckpt_import
from realm_tf.release import corpus_import

logger = logging.getLogger(__name__)

KINDS = ("embedder", "bert", "openqa")
IMPORT_JSON = "import.json"  # artifacts.REALM_IMPORT: the marker of a complete import
VOCAB = "vocab.txt"
#: ORQA's ``params.json`` keys (``orqa_experiment.py`` flags) → our settings.
_ORQA_PARAMS = {"reader_beam_size": "model.reader_beam_size", "max_span_width": "model.max_span_width",
                "reader_seq_len": "model.reader_seq_length", "block_seq_len": "model.block_seq_length",
                "query_seq_len": "qa.question_seq_length"}


def _check_vocabulary(vocab_path: str, rows: int) -> None:
    """Refuses a vocabulary whose size is not the number of rows of the checkpoint's word embeddings."""
    vocab_size = len(bert_tokenizer.read_vocab(vocab_path))
    if vocab_size != rows:
        raise errors.UserError(f"{vocab_path}: {vocab_size} tokens, but the checkpoint's word embeddings have "
                               f"{rows} rows (--vocab)")


def _check_request(kind: str, src: str, out: str, embedder: str | None,
                   blocks: str | None) -> tuple[str | None, dict[str, Any]]:
    """Refuses an import that cannot be done (an unknown kind, a run already in ``out``, a corpus without a
    retriever, ORQA without its embedder); returns the embedder module and ORQA's ``params.json`` (openqa)."""
    if kind not in KINDS:
        raise errors.UserError(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    if tf.io.gfile.exists(out) and (not tf.io.gfile.isdir(out) or tf.io.gfile.listdir(out)):
        raise errors.UserError(f"{out}: already holds "
                               + ("an import" if artifacts.is_complete(out, artifacts.REALM_IMPORT) else "files")
                               + "; choose another --output or delete it")
    if kind == "bert" and blocks:
        raise errors.UserError("--blocks needs a retriever: import the corpus with --kind embedder or openqa")
    if kind != "openqa":
        return embedder, {}
    orqa_params = _orqa_params(src)
    embedder = embedder or orqa_params.get("retriever_module_path")
    if not embedder:
        raise errors.UserError(f"--kind openqa needs --embedder: the retriever module whose encoded/encoded.ckpt "
                               f"holds the block embeddings ({src}/params.json names none)")
    return embedder, orqa_params


def import_realm(kind: str, src: str, out: str, cfg: config_lib.ExperimentConfig, embedder: str | None = None,
                 blocks: str | None = None, titles: str | None = None, block_emb: str | None = None,
                 vocab: str | None = None, num_attention_heads: int = 0,
                 ignore: Sequence[str] = ()) -> dict[str, Any]:
    """Imports the released model ``src`` of ``kind`` (one of :data:`KINDS`) into the run directory ``out``.

    Args:
      kind: ``embedder``, ``bert`` or ``openqa`` (see the module docstring).
      src: the TF-Hub module directory, ORQA model directory or checkpoint prefix (any ``tf.io.gfile`` path).
      out: the run directory to write (must not hold a checkpoint yet).
      cfg: the experiment the import is written into (``params.yaml``), e.g. ``configs/base.yaml``.
      embedder: ``openqa``: the retriever module that encoded the blocks (default: ``retriever_module_path`` of
        ``<src>/params.json``); its vocabulary and ``encoded/encoded.ckpt`` are the defaults below.
      blocks: ORQA's ``blocks.tfr`` to import as the corpus (with ``block_emb`` as the index); None: no corpus.
      titles: the ``titles.tfr`` of ``blocks`` (default: next to it, when it exists).
      block_emb: the checkpoint of ``block_emb`` (default: ``<embedder module>/encoded/encoded.ckpt``).
      vocab: the vocabulary (default: the module's ``assets/vocab.txt``); copied to ``out``.
      num_attention_heads: BERT's heads (not in the checkpoint; default hidden / 64, as every released BERT).
      ignore: regexes of checkpoint variables that are not weights of the model (besides the optimizer state and
        the unused heads, which are always ignored and listed), recorded in ``import.json``.

    Returns:
      the content of ``import.json``.
    """
    start = time.time()
    out = out.rstrip("/")
    embedder, orqa_params = _check_request(kind, src, out, embedder, blocks)
    module = (embedder if kind == "openqa" else src).rstrip("/")
    extra_ignores = {pattern: "ignored on the command line (--ignore-variables)" for pattern in ignore}
    imp = ckpt_import.Tf1CheckpointImport(src, extra_ignores)
    # Written whole into a staging directory, then published as ``out`` (import.json, with every file's checksum,
    # last): a crash leaves nothing at ``out`` and a rerun starts afresh.
    with artifacts.staged(out, artifacts.REALM_IMPORT) as staging:
        work = staging.path
        source_vocab = vocab or f"{module}/assets/vocab.txt"
        vocab_path, lower_case = _copy_vocab(source_vocab, work)
        cfg = _original_architecture(cfg, kind, vocab_path, lower_case, orqa_params)
        if kind == "openqa":
            doc_imp = ckpt_import.Tf1CheckpointImport(embedder, extra_ignores)
            cfg, items, reports = _import_open_qa(imp, doc_imp, cfg, num_attention_heads)
        else:
            cfg, items, reports = (_import_embedder if kind == "embedder" else _import_bert)(imp, cfg,
                                                                                             num_attention_heads)
        _check_vocabulary(vocab_path, cfg.model.encoder.vocab_size)
        corpus: dict[str, Any] = {}
        if blocks:
            cfg = _apply(cfg, {"data.blocks_dir": f"{work}/blocks", "index.index_dir": f"{work}/index"})
            corpus = _import_corpus(cfg, blocks, titles, block_emb or f"{module}/encoded/encoded.ckpt", source_vocab)
        cfg = _apply(cfg, {_RUN_KEYS[kind]: work})
        warm_start.write_checkpoint(work, **items)
        cfg = _relocated(cfg, work, out, kind, bool(blocks))
        config_lib.save_params(cfg, work)
        staging.metadata = report = {
            "kind": kind, "source": src, "embedder": embedder if kind == "openqa" else None,
            "checkpoint": os.path.join(out, "checkpoints", "ckpt-0"), "vocab": cfg.model.vocab_file,
            "lower_case": lower_case, "model": config_lib.to_dict(cfg.model), "imports": reports,
            "corpus": corpus, "seconds": round(time.time() - start, 1)}
    return report


def _original_architecture(cfg: config_lib.ExperimentConfig, kind: str, vocab_path: str, lower_case: bool,
                           orqa_params: dict[str, Any]) -> config_lib.ExperimentConfig:
    """``cfg`` with the released model's architecture (REALM fine-tuned with ORQA's reader), whatever --config
    says, and ORQA's own hyperparameters where its ``params.json`` gives them."""
    return _apply(cfg, {"model.init_checkpoint": "", "model.vocab_file": vocab_path, "model.lower_case": lower_case,
                        "model.pooling": "pooled", "model.share_embedders": kind == "embedder",
                        "model.span_layer_norm": True, "model.reader_block_title": False,
                        "model.retrieval_temperature": 1.0,
                        **{key: orqa_params[name] for name, key in _ORQA_PARAMS.items() if name in orqa_params}})


#: The setting that names the run an import becomes, by kind.
_RUN_KEYS = {"embedder": "model.retriever_checkpoint", "bert": "qa.reader_checkpoint", "openqa": "finetune.model_dir"}


def _relocated(cfg: config_lib.ExperimentConfig, work: str, out: str, kind: str,
               corpus: bool) -> config_lib.ExperimentConfig:
    """``cfg`` with the paths into the staging directory ``work`` pointing into ``out``, where it is published."""
    keys = ["model.vocab_file", _RUN_KEYS[kind], *(["data.blocks_dir", "index.index_dir"] if corpus else [])]
    values = {}
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        for before, after in ((os.path.abspath(work), os.path.abspath(out)), (work, out)):
            if value.startswith(before):
                value = after + value[len(before):]
                break
        values[key] = value
    return _apply(cfg, values)


def summarize(report: dict[str, Any]) -> str:
    """A few lines about an import, for the command line."""
    lines = [f"import-realm --kind {report['kind']}: {report['checkpoint']} in {report['seconds']}s"]
    for part in report["imports"]:
        lines.append(f"  {part['checkpoint']}: {len(part['assigned'])} variables assigned, "
                     f"{len(part['ignored'])} ignored (reasons in {IMPORT_JSON})")
    corpus = report["corpus"]
    if corpus:
        lines.append(f"  corpus: {corpus['blocks']['blocks']:,} blocks, index version {corpus['index']['version']} "
                     f"({corpus['index']['kind']})")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------------------
# Implementation.


def _import_embedder(imp: ckpt_import.Tf1CheckpointImport, cfg: config_lib.ExperimentConfig,
                     heads: int) -> tuple[config_lib.ExperimentConfig, dict[str, Any], list[dict[str, Any]]]:
    scope, layer_norm = ckpt_import.embedder_scope(imp)
    cfg = _with_embedder(cfg, imp, scope, layer_norm, heads)
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model, restore=False)
    ckpt_import.add_embedder(imp, retriever.query_embedder, scope, layer_norm)
    report = imp.apply([retriever])
    return cfg, {"model": retriever}, [report]


def _import_bert(imp: ckpt_import.Tf1CheckpointImport, cfg: config_lib.ExperimentConfig,
                 heads: int) -> tuple[config_lib.ExperimentConfig, dict[str, Any], list[dict[str, Any]]]:
    scope = ckpt_import.bert_scope(imp)
    cfg = _with_encoder(cfg, ckpt_import.encoder_config(imp, scope, heads))
    encoder = knowledge_augmented_encoder.build_knowledge_augmented_encoder(cfg.model, restore=False)
    ckpt_import.add_bert(imp, encoder.encoder, scope)
    ckpt_import.add_masked_lm(imp, encoder.masked_lm, scope)
    imp.ignore("^" + scope + "cls/seq_relationship/", "BERT's next-sentence head: REALM's reader reads the MLM "
               "head only (signature 'mlm')")
    report = imp.apply([encoder])
    # Shaped like a REALM pre-training run's knowledge-augmented encoder (RealmPretrainer.encoder).
    return cfg, {"model": tf.train.Checkpoint(encoder=encoder)}, [report]


def _import_open_qa(imp: ckpt_import.Tf1CheckpointImport, doc_imp: ckpt_import.Tf1CheckpointImport,
                    cfg: config_lib.ExperimentConfig,
                    heads: int) -> tuple[config_lib.ExperimentConfig, dict[str, Any], list[dict[str, Any]]]:
    scope, layer_norm = ckpt_import.embedder_scope(imp, nested=True)
    doc_scope, doc_layer_norm = ckpt_import.embedder_scope(doc_imp)
    reader_scope = ckpt_import.bert_scope(imp, r"reader/(?:module/)+")
    cfg = _with_embedder(cfg, imp, scope, layer_norm, heads)
    _check_same(cfg, _with_embedder(cfg, doc_imp, doc_scope, doc_layer_norm, heads), f"{doc_imp.path} (--embedder)",
                imp.path)
    reader_encoder = ckpt_import.encoder_config(imp, reader_scope, heads)
    if reader_encoder != cfg.model.encoder:
        raise errors.UserError(f"{imp.path}: the reader's BERT ({reader_encoder}) differs from the retriever's "
                               f"({cfg.model.encoder}); model.encoder describes every BERT")
    span_kernel = imp.shapes.get("reader/dense/kernel")
    if span_kernel is None or span_kernel[1] % 2:
        raise errors.UserError(f"{imp.path}: no ORQA span projection reader/dense/kernel [hidden, 2 * span_hidden] "
                               f"(found {span_kernel})")
    cfg = _apply(cfg, {"model.span_hidden_size": span_kernel[1] // 2})
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model, restore=False)
    reader = span_reader.build_span_reader(cfg.model, restore=False)
    ckpt_import.add_embedder(imp, retriever.query_embedder, scope, layer_norm)
    ckpt_import.add_bert(imp, reader.encoder, reader_scope)
    ckpt_import.add_orqa_span_scorer(imp, reader.span_hidden, reader.span_layer_norm, reader.span_logit)
    imp.ignore("^" + reader_scope + "cls/", "the reader's BERT module's pre-training heads: ORQA's reader reads "
               "sequence_output only (orqa_model.read)")
    ckpt_import.add_embedder(doc_imp, retriever.doc_embedder, doc_scope, doc_layer_norm)
    reports = [imp.apply([retriever.query_embedder, reader]), doc_imp.apply([retriever.doc_embedder])]
    return cfg, {"retriever": retriever, "reader": reader}, reports


def _with_embedder(cfg: config_lib.ExperimentConfig, imp: ckpt_import.Tf1CheckpointImport, scope: str,
                   layer_norm: str, heads: int) -> config_lib.ExperimentConfig:
    """``cfg`` with the embedder's BERT, projection size and projection LayerNorm ε read from the checkpoint."""
    cfg = _with_encoder(cfg, ckpt_import.encoder_config(imp, scope + "module/", heads))
    return _apply(cfg, {"model.projection_size": imp.shapes[scope + "dense/kernel"][1],
                        "model.projection_layer_norm_epsilon": ckpt_import.LAYER_NORM_EPSILON[layer_norm]})


def _check_same(cfg: config_lib.ExperimentConfig, other: config_lib.ExperimentConfig, other_source: str,
                source: str) -> None:
    for key in ("encoder", "projection_size", "projection_layer_norm_epsilon"):
        if getattr(cfg.model, key) != getattr(other.model, key):
            raise errors.UserError(f"{other_source}: model.{key} = {getattr(other.model, key)} but {source} has "
                                   f"{getattr(cfg.model, key)}: the two towers must share one architecture")


def _import_corpus(cfg: config_lib.ExperimentConfig, blocks: str, titles: str | None, block_emb: str,
                   vocab: str) -> dict[str, Any]:
    """ORQA's blocks and block embeddings into ``data.blocks_dir`` and a new version of ``index.index_dir``,
    tokenized with ``vocab`` (the release's own file: the blocks' manifest names it)."""
    if titles is None:
        sibling = f"{os.path.dirname(blocks.rstrip('/'))}/titles.tfr"
        titles = sibling if tf.io.gfile.exists(sibling) else None
        logger.info("titles: %s", titles or f"none ({sibling} does not exist): blocks get empty titles")
    _, (_, dim) = corpus_import.block_emb_shape(block_emb)  # fails fast, before the long part
    if dim != cfg.model.projection_size:
        raise errors.UserError(f"{block_emb}: block_emb is {dim} wide, the retriever projects to "
                               f"{cfg.model.projection_size}: not the embeddings of this retriever")
    tokenizer = bert_tokenizer.BertTokenizer(vocab, cfg.model.lower_case)
    manifest = corpus_import.import_blocks(blocks, cfg.data.blocks_dir, tokenizer,
                                                    cfg.data.max_block_length, titles_path=titles)
    index = corpus_import.import_block_embeddings(block_emb, cfg.index.index_dir, cfg.index,
                                                           tokenizer.vocab_hash, manifest["blocks"],
                                                           cfg.model.projection_size)
    return {"blocks": manifest, "index": index}


def _orqa_params(src: str) -> dict[str, Any]:
    """``<src>/params.json``, the hyperparameters ORQA's Estimator saved with a model (empty when absent)."""
    path = f"{src.rstrip('/')}/params.json"
    if not tf.io.gfile.exists(path):
        return {}
    with tf.io.gfile.GFile(path) as f:
        try:
            return json.loads(f.read())
        except json.JSONDecodeError as e:
            raise errors.UserError(f"{path}: not JSON: {e}") from e


def _copy_vocab(source: str, out: str) -> tuple[str, bool]:
    """Copies the vocabulary into ``out``; returns its path and whether it is uncased (no upper-case token other
    than the bracketed specials: the BERT vocabularies REALM and ORQA used are uncased, ``do_lower_case``)."""
    if not tf.io.gfile.exists(source):
        raise errors.UserError(f"{source}: no vocabulary (a TF-Hub module keeps it in assets/vocab.txt; --vocab)")
    target = os.path.join(os.path.abspath(out), VOCAB)
    tf.io.gfile.copy(source, target, overwrite=True)
    tokens = bert_tokenizer.read_vocab(target)
    cased = any(t != t.lower() for t in tokens if not (t.startswith("[") and t.endswith("]")))
    return target, not cased


def _apply(cfg: config_lib.ExperimentConfig, values: dict[str, Any]) -> config_lib.ExperimentConfig:
    """``cfg`` with dotted ``{key: scalar}`` set, each checked as a ``--set`` override is."""
    for key, value in values.items():
        cfg = config_lib.apply_override(cfg, f"{key}={json.dumps(value)}")
    return cfg


def _with_encoder(cfg: config_lib.ExperimentConfig, encoder: config_lib.EncoderConfig) -> config_lib.ExperimentConfig:
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, encoder=encoder))
