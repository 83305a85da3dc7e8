"""Is a question file ordered? Reference length and exact match by position in the file (issue #15 §5).

The demo used to take the first N questions of ``qa_qed_train`` as its sample. This prints, for every block of
``--bin`` consecutive questions, the mean reference length in words and the shares longer than 5 and 10 words (over
all questions, trained on or not), and, for each ``--predictions`` file (``realm-tf evaluate`` output), the exact
match of its questions in that block. A file whose difficulty drifts with position makes a prefix an
unrepresentative sample; the demo now samples at random (``realm_tf/demo._subset``).

    .venv/bin/python benchmarks/question_order.py --predictions runs/bench/qa4/predictions-dev-warm-start-dense.jsonl
"""
from __future__ import annotations

import argparse
import gzip
import json
import random
import statistics
import sys


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--bin", type=int, default=800, help="questions per position block")
    parser.add_argument("--predictions", action="append", default=[], metavar="FILE.jsonl",
                        help="evaluate predictions (repeatable): their exact match per position block")
    parser.add_argument("--sample", type=int, default=800,
                        help="also describe the demo's seeded random sample of this many questions (0: no)")
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
