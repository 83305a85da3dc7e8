"""How much of an imported embedder's ranking each projection initialisation keeps (issue #16).

Pools every block and every dev question once with the imported BERT (``model.pooling``; all-MiniLM-L6-v2
mean pooling), then ranks exactly (numpy) with:

* ``full_width_cosine``: the import as it was trained (384-d cosine, no projection): the reference;
* ``random``: REALM's fresh random projection (the seeded initialiser the towers get) + LayerNorm;
* ``pca`` / ``pca_centered``: ``realm-tf init-retriever``'s principal projection, fitted on the same
  ``--fit_blocks`` sample it uses, + LayerNorm.

Reports accuracy@k on the dev split of the bundled questions (``question_split``), and the top-k overlap
with the reference ranking. Pooled outputs are cached in ``--cache`` (an .npz), so a rerun only ranks.

    nohup .venv/bin/python benchmarks/projection_benchmark.py > runs/bench/projection.log 2>&1 &
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.data import block_store  # noqa: E402
from realm_tf.data import questions  # noqa: E402
from realm_tf.layers import bert_tokenizer  # noqa: E402
from realm_tf.models import knowledge_retriever  # noqa: E402
from realm_tf.tasks import open_qa  # noqa: E402
from realm_tf.tasks import projection_init  # noqa: E402
from realm_tf.tasks import qa_metrics  # noqa: E402

import result_records  # noqa: E402  (benchmarks/)


def layer_norm(x: np.ndarray) -> np.ndarray:
    return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-12)


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--blocks", default="runs/bench/blocks", help="the bundled corpus, preprocessed")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--cache", default="runs/bench/projection_pooled.npz")
    parser.add_argument("--fit_blocks", type=int, default=4096, help="blocks sampled to fit (as init-retriever)")
    parser.add_argument("--compare", action="append", default=[], metavar="NAME=PREDICTIONS.jsonl",
                        help="also score the top blocks recorded by `realm-tf evaluate --predictions` (e.g. after "
                             "fine-tuning), paired with the 384-d cosine per question")
    args = parser.parse_args()
    cfg = config_lib.load_config(args.config, [f"data.blocks_dir={args.blocks}", *args.overrides])
    blocks = block_store.BlockStore.load(os.path.join(args.blocks, "blocks-*.tfrecord*"))
    dev = open_qa.select_split(questions.read_questions(args.questions), "dev", cfg.data)
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model)
    print(f"{len(blocks)} blocks, {len(dev)} dev questions, projection {cfg.model.projection_size}, pooling "
          f"{cfg.model.pooling}", flush=True)
    if os.path.exists(args.cache):
        cached = np.load(args.cache)
        pooled_blocks, pooled_questions = cached["blocks"], cached["questions"]
    else:
        start = time.time()
        pooled_blocks = projection_init.pooled_block_outputs(retriever, blocks, tokenizer, np.arange(len(blocks)),
                                                             cfg.model.block_seq_length)
        print(f"pooled {len(blocks)} blocks in {time.time() - start:.0f}s", flush=True)
        packed = tokenizer.pack_single(tokenizer(tf.constant([e.question for e in dev])),
                                       cfg.qa.question_seq_length, pad_to_seq_length=False)
        pooled_questions = retriever.query_embedder.pool(packed, training=False).numpy()
        os.makedirs(os.path.dirname(args.cache) or ".", exist_ok=True)
        np.savez(args.cache + ".tmp.npz", blocks=pooled_blocks, questions=pooled_questions)
        os.replace(args.cache + ".tmp.npz", args.cache)

    rng = np.random.default_rng(cfg.data.seed)  # the sample init-retriever draws
    sample = np.sort(rng.choice(len(blocks), size=min(args.fit_blocks, len(blocks)), replace=False))
    size = cfg.model.projection_size
    random_kernel = retriever.doc_embedder.projection.kernel.numpy()  # the seeded fresh initialiser
    variants = {"full_width_cosine": (unit(pooled_questions), unit(pooled_blocks)),
                "random": (layer_norm(pooled_questions @ random_kernel), layer_norm(pooled_blocks @ random_kernel))}
    kept = {}
    for kind in ("pca", "pca_centered"):
        kernel, bias, kept[kind] = projection_init.principal_projection(pooled_blocks[sample], size,
                                                                        centered=kind == "pca_centered")
        variants[kind] = (layer_norm(pooled_questions @ kernel + bias), layer_norm(pooled_blocks @ kernel + bias))
    matcher = qa_metrics.AnswerMatcher(blocks.texts)
    answers = [e.answers for e in dev]
    reference = None
    scores: dict[str, dict[str, float]] = {}  # projection -> its metrics
    print(f"{'projection':<20}{'acc@1':>8}{'acc@5':>8}{'acc@20':>8}{'overlap@5':>11}{'overlap@20':>11}  energy kept")
    for name, (queries, docs) in variants.items():
        top = np.argsort(-(queries @ docs.T), axis=1)[:, :100]  # [num_dev, 100] exact ranking
        if reference is None:
            reference = top
        metrics = scores[name] = qa_metrics.qa_metrics(top, matcher, answers, ks=(1, 5, 20))
        overlap = [np.mean([len(set(a[:k]) & set(b[:k])) / k for a, b in zip(top, reference)]) for k in (5, 20)]
        print(f"{name:<20}{metrics['accuracy@1']:>8.3f}{metrics['accuracy@5']:>8.3f}{metrics['accuracy@20']:>8.3f}"
              f"{overlap[0]:>11.3f}{overlap[1]:>11.3f}  {kept.get(name, '')}", flush=True)
    for spec in args.compare:
        name, path = spec.split("=", 1)
        compare_predictions(name, path, dev, reference, matcher)
    full, pca, rand = (scores[name]["accuracy@1"] for name in ("full_width_cosine", "pca_centered", "random"))
    result_records.write(  # "most": the centred PCA loses less than half of what the random projection loses
        "retrieval-projection-init", area="Retrieval and the MIPS index", order=20,
        verdict="holds" if full - pca < (full - rand) / 2 else "negative",
        claim="Initialising the retriever's projection from the corpus's principal components keeps most of the "
              "ranking a random projection loses.",
        figure=f"{len(dev)} dev questions, acc@1 / acc@5: PCA-centred {size}-d {pca:.3f} / "
               f"{scores['pca_centered']['accuracy@5']:.3f}, random {size}-d {rand:.3f} / "
               f"{scores['random']['accuracy@5']:.3f}, full-width {pooled_blocks.shape[1]}-d cosine {full:.3f} / "
               f"{scores['full_width_cosine']['accuracy@5']:.3f}")
    return 0


def compare_predictions(name: str, path: str, dev: list, reference: np.ndarray,
                        matcher: qa_metrics.AnswerMatcher) -> None:
    """accuracy@1/5 of the ``retrieved_block_ids`` in a predictions file, and a paired (McNemar) comparison
    of accuracy@1 with the reference ranking on the same questions."""
    import json  # pylint: disable=import-outside-toplevel
    import math  # pylint: disable=import-outside-toplevel

    with open(path, encoding="utf-8") as f:
        retrieved = {row["id"]: row["retrieved_block_ids"] for row in map(json.loads, f)}
    rows = [i for i, e in enumerate(dev) if e.id in retrieved]
    def hit(ids, answers, k):
        norm = qa_metrics.normalized_answers(answers)
        return bool(norm) and any(matcher.has_answer(int(b), norm) for b in ids[:k])

    theirs = np.array([hit(retrieved[dev[i].id], dev[i].answers, 1) for i in rows])
    ours5 = np.array([hit(retrieved[dev[i].id], dev[i].answers, 5) for i in rows])
    ref = np.array([hit(reference[i], dev[i].answers, 1) for i in rows])
    only_theirs, only_ref = int(np.sum(theirs & ~ref)), int(np.sum(~theirs & ref))
    discordant = only_theirs + only_ref
    # Exact two-sided McNemar (binomial) p-value of the discordant pairs.
    tail = sum(math.comb(discordant, j) for j in range(min(only_theirs, only_ref) + 1)) / 2 ** discordant \
        if discordant else 1.0
    print(f"{name}: {len(rows)} questions, acc@1 {theirs.mean():.3f} (full_width_cosine {ref.mean():.3f}), "
          f"acc@5 {ours5.mean():.3f}; right only with {name}: {only_theirs}, only with full_width_cosine: "
          f"{only_ref}; McNemar exact p = {min(1.0, 2 * tail):.3f}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
