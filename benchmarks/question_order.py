"""Is a question file ordered? Reference length and exact match by position in the file (issue #15 §5).

The demo used to take the first N questions of ``qa_qed_train`` as its sample. This prints, for every block of
``--bin`` consecutive questions, the mean reference length in words and the shares longer than 5 and 10 words (over
all questions, trained on or not), and, for each ``--predictions`` file (``realm-tf evaluate`` output), the exact
match of its questions in that block. A file whose difficulty drifts with position makes a prefix an
unrepresentative sample; the demo now samples at random (``realm_tf/demo.sample_corpus``).

    .venv/bin/python benchmarks/question_order.py --predictions runs/bench/qa4/predictions-dev-warm-start-dense.jsonl
"""
from __future__ import annotations

import argparse
import gzip
import json
import math
import random
import statistics
import sys

import result_records  # (benchmarks/)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--bin", type=int, default=800, help="questions per position block")
    parser.add_argument("--predictions", action="append", default=[], metavar="FILE.jsonl",
                        help="evaluate predictions (repeatable): their exact match per position block")
    parser.add_argument("--sample", type=int, default=800,
                        help="also describe the demo's seeded random sample of this many questions (0: no)")
    parser.add_argument("--prefix", type=int, default=1600,
                        help="the first positions whose exact match is compared with the rest's, per predictions file")
    args = parser.parse_args()
    opener = gzip.open if args.questions.endswith(".gz") else open
    with opener(args.questions, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    position = {str(r["id"]): i for i, r in enumerate(rows)}
    words = [len(str(r["answers"][0]).split()) if r.get("answers") else 0 for r in rows]
    bins = list(range(0, len(rows), args.bin))
    print(f"{args.questions}: {len(rows)} questions; mean reference {statistics.fmean(words):.2f} words, "
          f"{sum(w > 5 for w in words) / len(words):.3f} longer than 5")
    header = f"{'positions':>11} {'words':>6} {'>5 words':>8} {'>10 words':>9}"
    results = []
    for path in args.predictions:
        with open(path, encoding="utf-8") as f:
            results.append([json.loads(line) for line in f])
        header += f"  {'EM (n)':>12}"
    print(header)
    for start in bins:
        part = words[start:start + args.bin]
        line = (f"{start:>5}-{start + len(part) - 1:<5} {statistics.fmean(part):6.2f} "
                f"{sum(w > 5 for w in part) / len(part):8.3f} {sum(w > 10 for w in part) / len(part):9.3f}")
        for rows_of_file in results:
            inside = [bool(p["exact_match"]) for p in rows_of_file
                      if start <= position.get(str(p["id"]), -1) < start + args.bin]
            line += f"  {sum(inside) / len(inside):6.3f} ({len(inside):3d})" if inside else f"  {'-':>12}"
        print(line)
    if args.sample:
        chosen = random.Random(0).sample(range(len(rows)), min(args.sample, len(rows)))
        sample = [words[i] for i in chosen]
        print(f"seeded random sample of {len(chosen)} (the demo's): mean reference {statistics.fmean(sample):.2f} "
              f"words, {sum(w > 5 for w in sample) / len(sample):.3f} longer than 5")
    if results:
        split = []  # per predictions file: (EM over the prefix, EM after it, their difference in standard errors)
        for path, rows_of_file in zip(args.predictions, results):
            at = [(position[str(p["id"])], bool(p["exact_match"])) for p in rows_of_file if str(p["id"]) in position]
            n_first, n_rest = sum(i < args.prefix for i, _ in at), sum(i >= args.prefix for i, _ in at)
            first = sum(em for i, em in at if i < args.prefix) / max(n_first, 1)
            rest = sum(em for i, em in at if i >= args.prefix) / max(n_rest, 1)
            error = math.sqrt(first * (1 - first) / max(n_first, 1) + rest * (1 - rest) / max(n_rest, 1))
            split.append((first, rest, (rest - first) / error if error else 0.0))
            print(f"{path}: EM over positions 0-{args.prefix - 1} {first:.3f} ({n_first}), after them {rest:.3f} "
                  f"({n_rest}): {split[-1][2]:.1f} standard errors apart")
        firsts, rests, apart = zip(*split)
        result_records.write(
            "demo-heldout-sample-order", area="Tests and the demo", order=30,
            verdict="holds" if min(apart) >= 2 else "negative",
            claim=f"The bundled NQ file is not in random order (its first {args.prefix:,} questions are harder for "
                  "every reader), so the demo samples its questions at random with a fixed seed.",
            figure=f"dev EM by file position, {len(results)} readers: {min(firsts):.2f}-{max(firsts):.2f} over "
                   f"positions 0-{args.prefix - 1:,} vs {min(rests):.2f}-{max(rests):.2f} after, "
                   f"{min(apart):.1f}-{max(apart):.1f} standard errors apart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
