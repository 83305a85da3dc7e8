"""The first N wrong dev answers of an ``evaluate --predictions`` file, by cause, with examples (issue #15).

Categories are :func:`open_qa_benchmark.error_category`'s: the answer in no read block, the wrong block chosen,
the right block but a wrong span, and spans that overlap a reference (split by which contains the other, so
that the annotation mismatch of long references is counted apart from real errors).

    .venv/bin/python benchmarks/open_qa_errors.py runs/bench/qa3/predictions-dev.jsonl --limit 50 --examples 3
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import open_qa_benchmark  # noqa: E402  (benchmarks/open_qa_benchmark.py)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("predictions", nargs="+", help="predictions JSONL of realm-tf evaluate --predictions")
    parser.add_argument("--limit", type=int, default=50, help="wrong answers counted, in file order")
    parser.add_argument("--examples", type=int, default=3, help="examples printed per category")
    args = parser.parse_args()
    for path in args.predictions:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        wrong = [p for p in rows if not p["exact_match"]]
        print(f"== {path}: {len(rows)} questions, {len(wrong)} wrong; the first {min(args.limit, len(wrong))}:")
        by_category: dict[str, list[dict]] = {c: [] for c in open_qa_benchmark.ERROR_CATEGORIES}
        for p in wrong[:args.limit]:
            by_category[open_qa_benchmark.error_category(p)].append(p)
        everything = dict.fromkeys(open_qa_benchmark.ERROR_CATEGORIES, 0)
        for p in wrong:
            everything[open_qa_benchmark.error_category(p)] += 1
        print(f"{'category':30s} {'first N':>8s} {'all wrong':>10s}")
        for category, members in by_category.items():
            print(f"{category:30s} {len(members):8d} {everything[category]:10d}")
        for category, members in by_category.items():
            for p in members[:args.examples]:
                print(f"  [{category}] {p['question']!r}: said {p['prediction']!r}; reference {p['answers'][0][:80]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
