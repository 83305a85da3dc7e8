"""Where the answers of ``evaluate --predictions`` files went wrong, with examples of each outcome.

The outcomes are :mod:`realm_tf.tasks.answer_errors`'s (``realm-tf evaluate --errors`` prints the same table):
too long, too short, a partial overlap, the answer in no read block, the right block but a wrong span, and the
wrong block chosen among the read ones.

    .venv/bin/python benchmarks/open_qa_errors.py runs/bench/qa3/predictions-dev.jsonl --examples 3
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from realm_tf.tasks import answer_errors  # noqa: E402

import result_records  # noqa: E402  (benchmarks/)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("predictions", nargs="+", help="predictions JSONL of realm-tf evaluate --predictions")
    parser.add_argument("--examples", type=int, default=3, help="examples printed per outcome")
    args = parser.parse_args()
    for path in args.predictions:
        rows = answer_errors.read_predictions(path)
        by_outcome: dict[str, list[dict]] = {name: [] for name in answer_errors.OUTCOMES}
        for p in rows:
            by_outcome[answer_errors.outcome(p)].append(p)
        print(f"== {path}: {len(rows)} questions")
        print(answer_errors.format_table({name: len(members) for name, members in by_outcome.items()}))
        for name, members in by_outcome.items():
            if name == "correct":
                continue
            for p in members[:args.examples]:
                print(f"  [{name}] {p['question']!r}: said {p['prediction']!r}; reference {p['answers'][0][:80]!r}")
    if len(args.predictions) == 1:  # one system's answers
        count = {name: len(members) for name, members in by_outcome.items()}
        wrong = len(rows) - count["correct"]
        read = max((len(p.get("retrieved_block_ids", [])) for p in rows), default=0)
        result_records.write(
            "open-qa-dev-errors", area="Open-QA", order=70,
            verdict="holds" if wrong - count["answer_not_read"] > count["answer_not_read"] else "negative",
            claim=f"The end-to-end system's wrong answers are reading errors more than retrieval misses; "
                  f"{count['too_short'] / max(wrong, 1):.0%} are a short form inside a longer reference.",
            figure=f"{wrong:,} wrong of {len(rows):,}: answer not in the {read} blocks read "
                   f"{count['answer_not_read']}, wrong block {count['wrong_block']}, right block wrong span "
                   f"{count['right_block_wrong_span']}, "
                   f"prediction inside the reference {count['too_short']} ({count['too_short'] / max(wrong, 1):.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
