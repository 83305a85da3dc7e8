"""What the loop computes on the tiny config, as numbers: the before/after check of refactorings (issue #17).

``fingerprint(workdir)`` runs, seeded, the stages through their stable entry points (``realm-tf preprocess`` and
``generate-pretraining-data``, the retriever export and ``embed-blocks``, ``pretrain``, ``finetune`` and
``evaluate``) on 80 bundled passages, and returns the sha256 of the block files, a digest of the block
embeddings, the retrieved blocks, the pre-training losses and the Open-QA predictions.

Run as a script against any checkout to record its values::

    PYTHONPATH=<checkout> python tests/integration/behaviour_fingerprint.py --out values.json

(``PYTHONPATH`` first, so ``realm_tf`` is imported from that checkout.)
"""
from __future__ import annotations

import argparse
import glob
import gzip
import hashlib
import itertools
import json
import os
import sys
import tempfile
from typing import Any

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tf_keras  # noqa: E402

TINY = "configs/tiny.yaml"
QUESTIONS = [
    {"id": "q0", "question": "who wrote the declaration of independence", "answers": ["Thomas Jefferson"]},
    {"id": "q1", "question": "when did the war end", "answers": ["1945"]},
    {"id": "q2", "question": "what is the capital of france", "answers": ["Paris"]},
    {"id": "q3", "question": "where is the river", "answers": ["Europe"]},
    {"id": "q4", "question": "who is the president", "answers": ["Lincoln"]},
    {"id": "q5", "question": "what language is spoken there", "answers": ["English"]},
]


def _sha256_of(pattern: str) -> str:
    """sha256 over the sorted records of the TFRecord files, each re-serialised with its feature map in key
    order (Beam writes records in no fixed order, and a map's serialised order may differ between processes)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    records = []
    for path in sorted(glob.glob(pattern)):
        compression = "GZIP" if path.endswith(".gz") else ""
        records += [tf.train.Example.FromString(r.numpy()).SerializeToString(deterministic=True)
                    for r in tf.data.TFRecordDataset(path, compression_type=compression)]
    digest = hashlib.sha256()
    for record in sorted(records):
        digest.update(record)
    return f"{len(records)} records {digest.hexdigest()}"


def fingerprint(work: str, data: str | None = None) -> dict[str, Any]:
    """Runs the stages in ``work`` (an empty directory) and returns their outputs as JSON-able values.

    ``data``: a directory whose ``blocks/`` and ``pretraining/`` are already ``preprocess`` and
    ``generate-pretraining-data`` of the same 80 passages on the tiny config (the tests' shared workspace); they
    are then hashed instead of being made a second time."""
    from beam_jobs import embed_blocks  # pylint: disable=import-outside-toplevel
    from beam_jobs import generate_pretraining_data  # pylint: disable=import-outside-toplevel
    from beam_jobs import preprocess_corpus  # pylint: disable=import-outside-toplevel
    from realm_tf import config  # pylint: disable=import-outside-toplevel
    from realm_tf.tasks import open_qa  # pylint: disable=import-outside-toplevel
    from realm_tf.tasks import realm_pretraining  # pylint: disable=import-outside-toplevel

    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        lines = list(itertools.islice(f, 80))
    with open(f"{work}/corpus.jsonl", "w", encoding="utf-8") as f:
        f.writelines(lines)
    with open(f"{work}/questions.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(q) + "\n" for q in QUESTIONS)
    data = data or work
    overrides = [f"data.blocks_dir={data}/blocks", f"data.pretraining_dir={data}/pretraining",
                 f"index.index_dir={work}/index", f"refresh.export_dir={work}/export",
                 f"pretrain.model_dir={work}/pretrain", f"finetune.model_dir={work}/finetune",
                 "refresh.mode=external", "refresh.export_every_steps=0", "pretrain.steps=3",
                 "pretrain.summary_every_steps=1", "pretrain.eval_examples=8", "data.batch_size=2",
                 "finetune.steps=2", "finetune.summary_every_steps=1", "data.qa_dev_fraction=0.0",
                 "data.qa_tune_fraction=0.0", f"qa.retriever_checkpoint={work}/pretrain",
                 f"qa.reader_checkpoint={work}/pretrain",
                 "qa.recompute_doc_embeddings=true"]  # the index comes from the untrained export
    if data == work:
        preprocess_corpus.JOB.call(config=TINY, overrides=overrides, input=[f"{work}/corpus.jsonl"],
                                   output=f"{work}/blocks")
        generate_pretraining_data.JOB.call(config=TINY, overrides=overrides)
    cfg = config.load_config(TINY, overrides)
    out: dict[str, Any] = {"blocks_sha256": _sha256_of(f"{data}/blocks/blocks-*"),
                           "pretraining_sha256": _sha256_of(f"{data}/pretraining/pretraining-*")}

    tf_keras.utils.set_random_seed(0)
    # exports the initial retriever, embeds every block, trains
    result = realm_pretraining.pretrain(cfg, index_builder=embed_blocks.embed_and_publish)
    embeddings = np.load(sorted(glob.glob(f"{work}/index/*/embeddings.npy"))[0])
    out["embeddings"] = {"shape": list(embeddings.shape), "abs_sum": float(np.abs(embeddings).sum()),
                         "first_row": [round(float(x), 5) for x in embeddings[0, :6]]}
    out["pretrain"] = {"step": result["step"], "train_loss": round(result["train"]["loss"], 5),
                       "mlm_accuracy": round(result["train"]["mlm_accuracy"], 5),
                       "eval_log_likelihood": round(result["eval"]["log_likelihood"], 5),
                       "index_versions": sorted(str(k) for k in result["index_versions"])}

    tf_keras.utils.set_random_seed(0)
    result = open_qa.finetune(cfg, f"{work}/questions.jsonl")
    out["finetune"] = {"step": result["step"], "loss": round(result["train"]["loss"], 5)}
    metrics = open_qa.evaluate(cfg, f"{work}/questions.jsonl", predictions_path=f"{work}/predictions.jsonl")
    with open(f"{work}/predictions.jsonl", encoding="utf-8") as f:
        predictions = [json.loads(line) for line in f]
    out["retrieved_block_ids"] = [p["retrieved_block_ids"] for p in predictions]
    out["predictions"] = [[p["prediction"], round(p["score"], 4)] for p in predictions]
    out["accuracy@5"] = metrics["accuracy@5"]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="JSON file to write")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        values = fingerprint(work)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(values, f, indent=1)
    print(json.dumps(values), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
