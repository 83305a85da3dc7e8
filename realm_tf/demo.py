"""The main job (``make demo``): REALM's whole loop on the bundled Open-QA sample.

The loop of Guu et al. (2020): preprocess the corpus into blocks → embed every block with Embed_doc → build
the MIPS index → (ICT warm start / REALM pre-training) → fine-tune on questions → evaluate → export →
answer. Stages that are not built yet are listed as such; what runs today is checked for real.
"""
from __future__ import annotations

import gzip
import json
import time

import numpy as np

from realm_tf import config as config_lib

# (stage, what it does, the subcommand that runs it today or "" when it is not built yet)
PLAN = (
    ("preprocess", "corpus JSONL -> 288-wordpiece blocks (beam_jobs/preprocess_corpus)", "realm-tf preprocess"),
    ("ict", "Inverse Cloze Task warm start of the retriever", "realm-tf generate-ict-data, realm-tf train-ict"),
    ("embed", "Embed_doc(z) for every block (beam_jobs/embed_blocks)", "realm-tf embed-blocks"),
    ("index", "ScaNN index published to index_dir/<version>/", "realm-tf embed-blocks"),
    ("pretrain", "REALM MLM pre-training with asynchronous index refresh", ""),
    ("finetune", "Open-QA fine-tuning on bundled questions", ""),
    ("evaluate", "exact match and retrieval accuracy on a held-out split", ""),
    ("export", "SavedModel for TF Serving", ""),
    ("ask", "answer sample questions", ""),
)


def run(cfg: config_lib.ExperimentConfig) -> int:
    """Prints the plan, writes params.yaml, and checks that the configured BERT weights load and work."""
    from realm_tf.layers import bert_tokenizer
    from realm_tf.networks import bert_encoder
    from realm_tf.networks import bert_weight_import

    params = config_lib.save_params(cfg, cfg.trainer.model_dir)
    print(f"realm-tf demo: experiment '{cfg.name}', resolved config written to {params}")
    print("plan:")
    for i, (name, what, command) in enumerate(PLAN, 1):
        status = f"built: {command}" if command else "not built yet"
        print(f"  [{i}/{len(PLAN)}] {name:<10} {what}  ({status})")
    print("the demo does not chain the built stages yet; README.md shows the commands in order")

    start = time.time()
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    encoder = bert_encoder.build_bert_encoder(cfg.model.encoder)
    if cfg.model.init_checkpoint:
        bert_weight_import.restore_encoder(encoder, cfg.model.init_checkpoint)
        print(f"loaded {cfg.model.init_checkpoint} into a {cfg.model.encoder.num_layers}-layer, "
              f"{cfg.model.encoder.hidden_size}-wide BertEncoderV2 in {time.time() - start:.1f}s "
              f"(vocab {tokenizer.vocab_size}, sha1 {tokenizer.vocab_hash[:12]})")
    else:
        print("model.init_checkpoint is empty: random initialisation")

    question, passages = _sample(cfg)
    texts = [question] + [p["text"] for p in passages]
    inputs = tokenizer.pack_single(tokenizer(texts), cfg.model.query_seq_length)
    sequence = encoder(inputs)["sequence_output"].numpy()  # [1 + num_passages, seq_len, hidden]
    mask = inputs["input_mask"].numpy()[:, :, None].astype(np.float32)
    pooled = (sequence * mask).sum(1) / mask.sum(1)
    pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
    scores = pooled[1:] @ pooled[0]
    print(f"sanity check, mean-pooled cosine to the question {question!r}:")
    for passage, score in sorted(zip(passages, scores), key=lambda t: -t[1]):
        print(f"  {score:+.3f}  {passage['title']}: {passage['text'][:70]}...")
    return 0


def _sample(cfg: config_lib.ExperimentConfig) -> tuple[str, list[dict]]:
    """The first training question, its gold passage and two passages about other things."""
    with gzip.open(cfg.data.qa_train, "rt", encoding="utf-8") as f:
        qa = json.loads(f.readline())
    gold = set(qa["gold_passage_ids"])
    chosen, others = [], []
    with gzip.open(cfg.data.corpus_pattern, "rt", encoding="utf-8") as f:
        for line in f:
            p = json.loads(line)
            if p["id"] in gold:
                chosen.append(p)
            elif len(others) < 2 and p["id"] % 1000 == 7:
                others.append(p)
            if chosen and len(others) == 2:
                break
    return qa["question"], chosen + others
