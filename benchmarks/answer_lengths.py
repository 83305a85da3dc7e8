"""How many reference answers the span reader can produce at all (issue #15 §0).

The reader scores spans of at most ``model.max_span_width`` wordpieces (REALM: 10). Counts, on the train split
(neither dev nor tune) of each question file, the answers and the questions whose every reference is longer:
those questions give the reader no training target, and the same share of dev questions can never be an exact
match. Also counts references longer than five words.

    .venv/bin/python benchmarks/answer_lengths.py
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
from realm_tf.data import questions  # noqa: E402
from realm_tf.layers import bert_tokenizer  # noqa: E402
from realm_tf.tasks import open_qa  # noqa: E402

import result_records  # noqa: E402  (benchmarks/)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--questions", nargs="+", default=["data/open_qa/qa_qed_train.jsonl.gz",
                                                           "data/open_qa/qa_squad_dev.jsonl.gz"])
    args = parser.parse_args()
    cfg = config_lib.load_config(args.config)
    width = cfg.model.max_span_width
    tokenizer = bert_tokenizer.BertTokenizer(cfg.model.vocab_file, cfg.model.lower_case)
    print(f"{'file':<36}{'split':>6}{'questions':>10}{'answers':>9}{'median wp':>10}{'p90 wp':>8}"
          f"{f'no answer <= {width} wp':>22}{'all > 5 words':>15}")
    record: dict[str, str] = {}  # claim and figure: the dev split of the first file
    for path in args.questions:
        examples = questions.read_questions(path)
        for split in ("train", "dev"):
            chosen = open_qa.select_split(examples, split, cfg.data)
            answers = [a for e in chosen for a in e.answers]
            lengths = tokenizer(tf.constant(answers)).row_lengths().numpy()  # [num_answers]
            shortest, start = [], 0
            for e in chosen:
                shortest.append(lengths[start:start + len(e.answers)].min())
                start += len(e.answers)
            too_long = int((np.asarray(shortest) > width).sum())
            wordy = sum(min(len(a.split()) for a in e.answers) > 5 for e in chosen)
            print(f"{os.path.basename(path):<36}{split:>6}{len(chosen):>10}{len(answers):>9}"
                  f"{np.median(lengths):>10.0f}{np.percentile(lengths, 90):>8.0f}"
                  f"{f'{too_long} ({too_long / len(chosen):.1%})':>22}{f'{wordy / len(chosen):.1%}':>15}")
            if path == args.questions[0] and split == "dev":
                share = too_long / len(chosen)
                record = dict(
                    claim=f"{share:.1%} of the dev questions of {os.path.basename(path)} have only references longer "
                          f"than the reader's {width}-wordpiece span limit, which caps EM at {1 - share:.2f} there.",
                    figure=f"{too_long:,} of {len(chosen):,} dev questions ({share:.1%}) have no reference of "
                           f"≤ {width} wordpieces; median {np.median(lengths):.0f}, p90 "
                           f"{np.percentile(lengths, 90):.0f} wordpieces")
    result_records.write("open-qa-long-references", area="Open-QA", order=80, **record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
