"""Has REALM's retriever collapsed? Diagnostics of one index version on held-out salient-span examples.

Prints, for block embeddings (an ``index_dir/<version>/`` or a ``.npy`` of them) and the query tower of an
export:
* the mean cosine between block embeddings (and between query embeddings): near 0 for a healthy embedder,
  near 1 when every vector points one way;
* how many distinct blocks are top-1 over the held-out queries;
* span recall@j: the share of held-out examples whose masked wordpieces appear, in order, in one of the top-j
  retrieved blocks (title [SEP] body, cut to what the reader sees), the query's own source block excluded.
  This is the most that retrieval can add to masked-LM accuracy.

    python benchmarks/retriever_collapse.py --params runs/bench/realm/model/params.yaml \
        --embeddings runs/bench/realm/index/0000000480 --export runs/bench/realm/export/480
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.data import block_store  # noqa: E402
from realm_tf.data import example_schemas  # noqa: E402
from realm_tf.layers import bert_tokenizer  # noqa: E402
from realm_tf.tasks import realm_pretraining  # noqa: E402

import result_records  # noqa: E402  (benchmarks/)


def mean_cosine(x: np.ndarray, limit: int = 2000) -> float:
    """Mean cosine between distinct rows of ``x`` ``[n, dim]`` (the first ``limit`` rows)."""
    unit = x[:limit] / np.linalg.norm(x[:limit], axis=1, keepdims=True)
    cos = unit @ unit.T
    n = len(unit)
    return float((cos.sum() - np.trace(cos)) / max(n * (n - 1), 1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", required=True, help="the pre-training run's params.yaml")
    parser.add_argument("--embeddings", required=True, help="index version directory or .npy of block embeddings")
    parser.add_argument("--export", required=True, help="retriever export whose query tower to use")
    parser.add_argument("--k", type=int, default=7, help="retrieved blocks per query (REALM: k - 1 besides null)")
    args = parser.parse_args()

    cfg = config_lib.load_config(args.params)
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    blocks = block_store.BlockStore.load(os.path.join(cfg.data.blocks_dir, "blocks-*.tfrecord*"))
    path = os.path.join(args.embeddings, "embeddings.npy") if os.path.isdir(args.embeddings) else args.embeddings
    embeddings = np.load(path)  # [num_blocks, dim]
    module = tf.saved_model.load(args.export)

    def embed(query_ids: tf.RaggedTensor) -> np.ndarray:  # [batch, dim]
        if "embed_query_ids" in module.signatures:
            packed = tokenizer.pack_single(query_ids, cfg.model.query_seq_length, pad_to_seq_length=False)
            return module.signatures["embed_query_ids"](**packed)["embedding"].numpy()
        # Older exports take text: the query without its [MASK] pieces.
        texts = [" ".join(tokenizer.vocab[i] for i in row if i != tokenizer.mask_id).replace(" ##", "")
                 for row in query_ids.to_list()]
        return module.signatures["embed_query"](text=tf.constant(texts))["embedding"].numpy()

    spec = example_schemas.pretraining_feature_spec()
    keep = {k: spec[k] for k in (example_schemas.QUERY_IDS, example_schemas.TARGET_IDS, example_schemas.SOURCE_UID,
                                 example_schemas.MASKING)}
    files = sorted(tf.io.gfile.glob(os.path.join(cfg.data.pretraining_dir, "pretraining-*.tfrecord*")))
    records = (tf.data.TFRecordDataset(files).map(lambda s: tf.io.parse_single_example(s, keep))
               .filter(realm_pretraining.salient_predicate(cfg.data.pretraining_heldout_fraction))
               .ragged_batch(16))
    sep = tokenizer.sep_id
    hits = np.zeros(args.k)
    tops, queries, n = [], [], 0
    for batch in records:
        query_ids = tf.cast(batch[example_schemas.QUERY_IDS], tf.int32)
        q = embed(query_ids)  # [batch, dim]
        queries.append(q)
        scores = q @ embeddings.T  # [batch, num_blocks]
        for b, uid in enumerate(batch[example_schemas.SOURCE_UID].numpy()):
            order = [i for i in np.argsort(-scores[b])[:args.k + 8] if blocks.uids[i] != uid.decode()][:args.k]
            span = batch[example_schemas.TARGET_IDS][b].numpy().tolist()
            room = cfg.model.reader_seq_length - 3 - int(query_ids[b].shape[0])
            room = max(room, (cfg.model.reader_seq_length - 3) // 2)  # join_bert keeps half for the document
            found = []
            for i in order:
                doc = (blocks.title_ids(i).tolist() + [sep] + blocks.body_ids(i).tolist())[:room]
                found.append(any(doc[j:j + len(span)] == span for j in range(len(doc) - len(span) + 1)))
            hits += np.cumsum(found) > 0
            tops.append(order[0])
            n += 1
    print(f"{args.embeddings}: {len(embeddings)} blocks, {n} held-out salient-span examples")
    print(f"mean cosine between block embeddings {mean_cosine(embeddings):.3f}, between query embeddings "
          f"{mean_cosine(np.concatenate(queries)):.3f}; distinct top-1 blocks {len(set(tops))} of {n}")
    print("span recall@j, j = 1.." + str(args.k) + ": " + " ".join(f"{h / max(n, 1):.3f}" for h in hits))
    version = os.path.basename(os.path.normpath(args.embeddings))
    collapsed = len(set(tops)) < n / 10  # most queries share a handful of top-1 blocks
    result_records.write(
        "realm-pretraining-retriever-collapse", area="REALM pre-training", order=30,
        verdict="negative" if collapsed else "holds",
        claim=f"REALM's retriever {'has collapsed' if collapsed else 'has not collapsed'} in pre-training: "
              + ("every query retrieves much the same blocks." if collapsed else
                 "queries retrieve blocks of their own."),
        figure=(f"index at step {int(version)}" if version.isdigit() else f"embeddings {version}")
               + f": mean cosine {mean_cosine(embeddings):.3f} between blocks, {len(set(tops))} distinct top-1 block"
               f"{'' if len(set(tops)) == 1 else 's'} for {n} queries, span recall@{args.k} {hits[-1] / max(n, 1):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
