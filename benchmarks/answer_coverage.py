"""Answer coverage of a salient span annotator (REALM §3.4 "Salient span masking").

REALM masks salient spans -- entities and dates -- so that pre-training practises exactly what
open-domain QA asks for. A good annotator therefore marks the answers of real questions as spans in the
passages that hold them. For each question of an Open-QA file this benchmark annotates the text of its
gold passage(s) (the passage ``text`` only, not the title: the masked pre-training blocks are body
text) and reports, with SQuAD normalisation on both sides:

* exact:            some answer equals some salient span;
* answer in span:   some answer is a whole-word part of some span ("Obama" in "Barack Obama");
* span in answer:   some span is a whole-word part of some answer ("Kelley" in "actress Nathalie
                    Kelley");
* answer in text:   some answer occurs in the passage at all (the ceiling for the three above);

plus the mean number of spans per passage and the annotation throughput.

Usage: python benchmarks/answer_coverage.py [--annotator rules|spacy] [--limit N] [--include-numbers]
"""
from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir))

from realm_tf.data import answer_normalization  # pylint: disable=wrong-import-position
from realm_tf.data import span_annotators  # pylint: disable=wrong-import-position

import result_records  # pylint: disable=wrong-import-position  (benchmarks/)

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "data", "open_qa")


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _contains(outer: str, inner: str) -> bool:
    """Whole-word containment of normalised strings."""
    return bool(inner) and f" {inner} " in f" {outer} "


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--annotator", default="rules", choices=span_annotators.ANNOTATORS)
    parser.add_argument("--questions", default=os.path.join(_DATA, "qa_qed_train.jsonl.gz"))
    parser.add_argument("--passages", default=os.path.join(_DATA, "passages.jsonl.gz"))
    parser.add_argument("--limit", type=int, default=0, help="first N questions only (0: all)")
    parser.add_argument("--include-numbers", action="store_true", help="also count NUMBER spans")
    parser.add_argument("--dump-misses", default="", help="write questions with no exact match here")
    args = parser.parse_args(argv)

    questions = _read_jsonl(args.questions)
    if args.limit:
        questions = questions[:args.limit]
    passages = {p["id"]: p for p in _read_jsonl(args.passages)}
    passage_ids = sorted({pid for q in questions for pid in q["gold_passage_ids"] if pid in passages})

    annotator = span_annotators.make_annotator(args.annotator,
                                                      include_numbers=args.include_numbers)
    texts = [passages[pid]["text"] for pid in passage_ids]
    started = time.perf_counter()
    annotations = annotator.annotate_batch(texts)
    elapsed = time.perf_counter() - started

    spans_by_passage: dict[int, list[tuple[str, str]]] = {}
    label_counts: collections.Counter[str] = collections.Counter()
    for pid, text, spans in zip(passage_ids, texts, annotations):
        spans_by_passage[pid] = [(answer_normalization.normalize_answer(s.text(text)), s.label)
                                 for s in spans]
        label_counts.update(s.label for s in spans)
    normalized_text = {pid: answer_normalization.normalize_answer(passages[pid]["text"])
                       for pid in passage_ids}

    counts: collections.Counter[str] = collections.Counter()
    exact_by_label: collections.Counter[str] = collections.Counter()
    misses = []
    for q in questions:
        answers = [a for a in (answer_normalization.normalize_answer(a) for a in q["answers"]) if a]
        spans = [s for pid in q["gold_passage_ids"] for s in spans_by_passage.get(pid, [])]
        in_text = any(_contains(normalized_text[pid], a) for pid in q["gold_passage_ids"]
                      if pid in normalized_text for a in answers)
        exact = [label for span, label in spans if span in answers]
        counts["questions"] += 1
        counts["answer in text"] += in_text
        counts["exact"] += bool(exact)
        counts["answer in span"] += any(_contains(span, a) for span, _ in spans for a in answers)
        counts["span in answer"] += any(_contains(a, span) for span, _ in spans for a in answers)
        if exact:
            exact_by_label[exact[0]] += 1
        elif in_text:
            misses.append({"question": q["question"], "answers": q["answers"],
                           "spans": [span for span, _ in spans]})

    n = counts["questions"]
    num_spans = sum(label_counts.values())
    print(f"annotator={args.annotator} include_numbers={args.include_numbers} "
          f"questions={n} gold passages={len(passage_ids)} (passage text, no title)")
    print(f"{'metric':<40}{'questions':>10}{'fraction':>10}")
    rows = [("answer occurs in gold passage (ceiling)", counts["answer in text"]),
            ("exact: answer == a salient span", counts["exact"])]
    rows += [(f"  exact, matched span label {label}", exact_by_label[label])
             for label in sorted(exact_by_label)]
    rows += [("answer contained in a salient span", counts["answer in span"]),
             ("a salient span contained in answer", counts["span in answer"])]
    for name, value in rows:
        print(f"{name:<40}{value:>10}{value / max(n, 1):>10.3f}")
    print(f"{'mean salient spans per passage':<40}{num_spans / max(len(passage_ids), 1):>20.2f}")
    for label in sorted(label_counts):
        print(f"{'  of which ' + label:<40}{label_counts[label] / max(len(passage_ids), 1):>20.2f}")
    print(f"{'throughput (passages/s)':<40}{len(passage_ids) / max(elapsed, 1e-9):>20.1f}")
    if args.dump_misses:
        with open(args.dump_misses, "w", encoding="utf-8") as f:
            for miss in misses:
                f.write(json.dumps(miss, ensure_ascii=False) + "\n")
    if args.annotator == "rules" and not args.limit and not args.include_numbers:  # the default tagger, all questions
        result_records.write(
            "data-salient-span-coverage", area="Data pipeline", order=20,
            claim="The rule-based salient-span tagger, the default, marks NQ answers as salient spans of their gold "
                  "passages.",
            figure=f"{n:,} questions: answer equals a salient span {counts['exact'] / max(n, 1):.3f}, contained in one "
                   f"{counts['answer in span'] / max(n, 1):.3f}; {len(passage_ids) / max(elapsed, 1e-9):.1f} "
                   "passages/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
