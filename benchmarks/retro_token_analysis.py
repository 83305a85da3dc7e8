"""Where RETRO's neighbours could help, and whether the trained models use them (issue #18's "why not"):
every scored token of held-out documents, classed by what the chunked cross-attention lets it see, with the
bits per token of the baseline, RETRO with retrieval on and off, and the RETRO-fitted baseline.

Under RETRO's causal shift (Borgeaud et al., 2021, §2.4), a target in chunk j of its sequence is predicted from
the neighbours of chunk j − 1 of the same sequence (the last token of chunk j − 1 sees them too, and it is the one
that predicts the first target of chunk j); targets in a sequence's first chunk see no neighbours. So each target
falls in one class:

- ``first chunk``: no neighbours can reach it;
- ``bigram in neighbours``: the previous token followed by the target occurs in a neighbour's value (chunk and
  continuation, r tokens): a copy from the neighbours would predict it;
- ``token in neighbours``: the target occurs in a neighbour's value, but not after the previous token;
- ``absent``: the target does not occur in the neighbours.

For each class and model: tokens, bits per token (−log2 p), and the class's share of the overall bits-per-byte
difference to the baseline (Σ ΔNLL / (ln 2 · all bytes)), so the rows of a model add up to its overall gain.

    .venv/bin/python benchmarks/retro_token_analysis.py --out runs/bench/retro [--split test]
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

# isort: split
import numpy as np  # noqa: E402

from realm_tf import config as config_lib  # noqa: E402
from realm_tf.retro import lm_evaluation  # noqa: E402
from realm_tf.retro import retro_lm  # noqa: E402

CLASSES = ("first chunk", "bigram in neighbours", "token in neighbours", "absent")


def token_classes(task: retro_lm.RetroLmTask, split: str, database: str) -> tuple[np.ndarray, np.ndarray]:
    """``(targets int32 [T], class int8 [T])`` of every scored token of ``split``, in ``score_tokens``' order
    (documents in ``document_chunks`` order, sequences in order, each sequence's tokens after its first)."""
    retro = task.cfg.retro
    m, n = retro.chunk_length, retro.sequence_length
    table = task.neighbour_table(split, database)  # [num_chunks, k]
    value_length = retro.chunk_length + retro.continuation_length
    targets, classes = [], []
    for _, chunk_ids in task.document_chunks(split):
        lengths = [task.store.tokens(int(c)).size for c in chunk_ids]
        if any(length != m for length in lengths[:-1]):
            raise ValueError(f"chunks {chunk_ids.tolist()}: only a document's last chunk may be short: {lengths}")
        stream = np.concatenate([task.store.tokens(int(c)) for c in chunk_ids])  # [L]
        seen: dict[int, tuple[set, set]] = {}  # previous chunk -> (tokens, bigrams) of its neighbours' values
        for p in range(stream.size):
            if p % n == 0:  # a sequence's first token is not predicted
                continue
            targets.append(stream[p])
            if (p % n) // m == 0:
                classes.append(0)
                continue
            previous = int(chunk_ids[p // m - 1])
            if previous not in seen:
                values, mask = task.store.values(table[previous], value_length)  # [k, r] each
                tokens, bigrams = set(), set()
                for row, keep in zip(values, mask):
                    row = row[keep].tolist()
                    tokens.update(row)
                    bigrams.update(zip(row[:-1], row[1:]))
                seen[previous] = (tokens, bigrams)
            tokens, bigrams = seen[previous]
            classes.append(1 if (int(stream[p - 1]), int(stream[p])) in bigrams else
                           2 if int(stream[p]) in tokens else 3)
    return np.asarray(targets, np.int32), np.asarray(classes, np.int8)


def analyse(cfg: config_lib.ExperimentConfig, out: str, split: str, database: str,
            limit_sequences: int) -> dict[str, Any]:
    """Bits per token of each model on each class of ``split``'s tokens (see the module docstring)."""
    retro_task = retro_lm.RetroLmTask(cfg, retrieval=True)
    baseline_task = retro_lm.RetroLmTask(cfg, retrieval=False)
    targets, classes = token_classes(retro_task, split, database)
    models = {"baseline": (baseline_task, "baseline", True), "RETRO on": (retro_task, "retro", True),
              "RETRO off": (retro_task, "retro", False), "RETRO-fit": (retro_task, "retro_fit", True)}
    log_probs, num_bytes = {}, None
    for name, (task, run, neighbours) in models.items():
        if not os.path.isdir(f"{out}/{run}"):
            print(f"{out}/{run}: missing, {name} skipped", flush=True)
            continue
        scores = lm_evaluation.score_tokens(task, lm_evaluation.restore_decoder(task, f"{out}/{run}"), split,
                                            neighbours=neighbours, database=database,
                                            limit_sequences=limit_sequences)
        count = scores.targets.size
        if not np.array_equal(scores.targets, targets[:count]):
            raise AssertionError(f"{name}: scored tokens are not in the classed order")
        log_probs[name] = scores.log_probs
        num_bytes = scores.bytes
        print(f"scored {name}: {count} tokens", flush=True)
    count = num_bytes.size
    classes = classes[:count]
    total_bytes = float(num_bytes.sum())
    result: dict[str, Any] = {"split": split, "database": database, "tokens": int(count), "bytes": int(total_bytes),
                              "classes": {}}
    for c, label in enumerate(CLASSES):
        keep = classes == c
        row: dict[str, Any] = {"tokens": int(keep.sum()), "bytes": int(num_bytes[keep].sum())}
        for name, lp in log_probs.items():
            row[f"{name} bits/token"] = float(-lp[keep].mean() / math.log(2)) if keep.any() else float("nan")
            row[f"{name} minus baseline, bpb share"] = float(
                -(lp[keep] - log_probs["baseline"][keep]).sum() / (math.log(2) * total_bytes))
        result["classes"][label] = row
    result["overall bpb"] = {name: float(-lp.sum() / (math.log(2) * total_bytes)) for name, lp in log_probs.items()}
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default="runs/bench/retro", help="the retro_benchmark run (baseline, retro, "
                                                                  "retro_fit)")
    parser.add_argument("--split", default="test", choices=("train", "validation", "test"))
    parser.add_argument("--database", default="train_only", choices=retro_lm.DATABASES)
    parser.add_argument("--limit_sequences", type=int, default=0, help="score only the first N sequences (0: all)")
    args = parser.parse_args()
    cfg = config_lib.load_config(args.config, args.overrides)
    result = analyse(cfg, args.out, args.split, args.database, args.limit_sequences)
    path = f"{args.out}/token-analysis-{args.split}-{args.database}.json"
    config_lib.atomic_write_text(path, json.dumps(result, indent=2) + "\n")
    names = list(result["overall bpb"])
    print(f"\n== {args.out}: {result['tokens']:,} {args.split} tokens ({result['bytes']:,} bytes), neighbours from "
          f"{args.database}; bits per token by class, and [the class's share of the bpb difference to the "
          f"baseline] ==")
    print(f"{'class':<22}{'tokens':>8}" + "".join(f"{n:>22}" for n in names))
    for label, row in result["classes"].items():
        cells = "".join(f"{row[f'{n} bits/token']:>11.3f} [{row[f'{n} minus baseline, bpb share']:+.4f}]"
                        for n in names)
        print(f"{label:<22}{row['tokens']:>8}{cells}")
    print(f"{'overall bpb':<30}" + "".join(f"{result['overall bpb'][n]:>22.4f}" for n in names))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
