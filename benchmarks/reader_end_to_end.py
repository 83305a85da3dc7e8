"""Readers end to end: each reader behind the same dense retriever over the whole bundled corpus, on dev.

A reader's gold-block EM (``reader_curve.py``) takes retrieval out. This run puts each reader given by ``--readers``
behind one retriever, without Open-QA fine-tuning. The retriever is the MiniLM import with its projection fitted to
the corpus (``init-retriever``), and its index covers the whole bundled corpus. Each reader reads the top
``model.reader_beam_size`` blocks of each dev question, as ``realm-tf evaluate`` does. The block choice comes from
S_read + w·S_retr. ORQA and REALM use w = 1. Here w is chosen on the tune split from :data:`WEIGHTS`
(``--score-weights``; EM, then F1). Each reader is scored on dev at w = 1 and at its chosen w, with the error
table of each.

Records:
- ``open-qa-reader-end-to-end``: the second reader of ``--readers`` against the first, each at its chosen w, with
  a paired bootstrap over the dev questions;
- ``open-qa-block-choice-weight``: the last reader at its chosen w against w = 1.

Resumable: each stage is kept in ``<out>/stages.json``.

    .venv/bin/python benchmarks/reader_end_to_end.py --out runs/bench/reader_e2e \\
      --readers constant=runs/bench/reader_curve/best,cooled=runs/bench/reader_curve/cooldown
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf.index import index_publisher  # noqa: E402
from realm_tf.tasks import answer_errors  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import open_qa_benchmark  # noqa: E402  (benchmarks/)
import reader_levers  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: The retrieval weights tried on tune: open_qa_benchmark's, and larger ones (a reader trained on gold blocks alone
#: ranks blocks badly by itself, so the retriever's share may need to be larger).
WEIGHTS = (*open_qa_benchmark.WEIGHTS, 4.0, 8.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--out", default="runs/bench/reader_e2e")
    parser.add_argument("--readers", required=True, help="NAME=RUN_DIR,... (reader runs: their checkpoints)")
    parser.add_argument("--corpus", default="data/open_qa/passages.jsonl.gz")
    parser.add_argument("--questions", default="data/open_qa/qa_qed_train.jsonl.gz")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        help="for every stage (the readers' own settings, e.g. model.max_span_width)")
    parser.add_argument("--tag", default="",
                        help="appended to the records' names (open-qa-reader-end-to-end-TAG, ...), so that another "
                             "pair of readers does not replace the records of the first")
    parser.add_argument("--notebook", default="", help="the notebook entry the records point to")
    args = parser.parse_args()

    out = args.out.rstrip("/")
    readers = dict(item.split("=", 1) for item in args.readers.split(",") if item)
    overrides = [f"data.blocks_dir={out}/blocks", f"index.index_dir={out}/index", f"refresh.export_dir={out}/export",
                 f"model.retriever_checkpoint={out}/retriever_init", f"qa.retriever_checkpoint={out}/retriever_init",
                 "model.max_span_width=24", *args.overrides]  # the readers of reader_curve.py
    sets = ["--config", args.config, *sum((["--set", o] for o in overrides), [])]
    stage = stages.Stages(out)
    stage("blocks", lambda: stages.cli(["preprocess", "--config", args.config, "--input", args.corpus,
                                        "--output", f"{out}/blocks"]))
    stage("retriever_init", lambda: stages.cli(["init-retriever", *sets, "--output", f"{out}/retriever_init"]))

    def index() -> None:
        if not index_publisher.complete_versions(f"{out}/index"):
            stages.cli(["export-retriever", *sets, "--model-dir", f"{out}/retriever_init", "--step", "0"])
            stages.cli(["embed-blocks", *sets])

    stage("index", index)
    scored: dict[str, dict[str, Any]] = {}
    for name, run in readers.items():
        base = [*sets, "--questions", args.questions, "--model", run]
        tune = stage(f"tune_{name}_{len(WEIGHTS)}_weights", lambda base=base, name=name: open_qa_benchmark.evaluate(
            [*base, "--split", "tune", "--score-weights", *map(str, WEIGHTS), "--predictions",
             f"{out}/predictions-tune-{name}.jsonl"], f"{out}/metrics-tune-{name}.json"))
        weight = reader_levers.choose_variant(tune, "w", WEIGHTS, 1.0)
        scored[name] = {"weight": weight, "tune": tune}
        for w in sorted({1.0, weight}):
            scored[name][w] = stage(f"dev_{name}_w{w:g}", lambda base=base, name=name, w=w: open_qa_benchmark.evaluate(
                [*base, "--split", "dev", "--set", f"qa.retrieval_score_weight={w}", "--predictions",
                 f"{out}/predictions-dev-{name}-w{w:g}.jsonl"], f"{out}/metrics-dev-{name}-w{w:g}.json"))
            print(f"\n{name}, w = {w:g}: dev EM {scored[name][w]['exact_match']:.3f}, F1 {scored[name][w]['f1']:.3f}, "
                  f"accuracy@5 {scored[name][w]['accuracy@5']:.3f}\n"
                  f"{answer_errors.format_table(scored[name][w]['outcomes'])}")
    write_records(out, scored, tag=args.tag, notebook=args.notebook)
    return 0


def write_records(out: str, scored: dict[str, dict[str, Any]], tag: str = "", notebook: str = "") -> None:
    """The second reader against the first (each at its chosen w), and the last reader's w against w = 1; the
    records' names end in ``-tag`` when one is given."""
    names = list(scored)

    def at_chosen(name: str) -> tuple[dict[str, Any], str]:
        w = scored[name]["weight"]
        return scored[name][w], f"{out}/predictions-dev-{name}-w{w:g}.jsonl"

    if len(names) >= 2:
        (first, first_path), (second, second_path) = at_chosen(names[0]), at_chosen(names[1])
        d = reader_levers.paired_difference(first_path, second_path)
        result_records.write(
            result_records.tagged("open-qa-reader-end-to-end", tag), area="Open-QA", order=24, notebook=notebook,
            verdict="holds" if d["EM"][1] > 0 else "negative",
            claim=f"The {names[1]} reader answers better end to end than the {names[0]} reader (the same dense "
                  "retriever over the whole bundled corpus, no Open-QA fine-tuning)",
            figure=f"dev, {second['num_questions']} questions: {names[1]} EM {second['exact_match']:.3f}, F1 "
                   f"{second['f1']:.3f} (w = {scored[names[1]]['weight']:g}) against {names[0]} "
                   f"{first['exact_match']:.3f} / {first['f1']:.3f} (w = {scored[names[0]]['weight']:g}); accuracy@5 "
                   f"{second['accuracy@5']:.3f}; wrong block among those read {second['outcomes']['wrong_block']} vs "
                   f"{first['outcomes']['wrong_block']}",
            interval=f"{names[1]} minus {names[0]}, 95% paired bootstrap over questions: "
                     + reader_levers.format_difference(d))
    last = names[-1]
    weight = scored[last]["weight"]
    if weight != 1.0:
        d = reader_levers.paired_difference(f"{out}/predictions-dev-{last}-w1.jsonl",
                                            f"{out}/predictions-dev-{last}-w{weight:g}.jsonl")
        chosen, orqa = scored[last][weight], scored[last][1.0]
        figure = (f"{last} reader, dev: EM {chosen['exact_match']:.3f} at w = {weight:g} (chosen on tune) against "
                  f"{orqa['exact_match']:.3f} at w = 1; wrong block among those read "
                  f"{chosen['outcomes']['wrong_block']} vs {orqa['outcomes']['wrong_block']}")
        interval = (f"w = {weight:g} minus w = 1, 95% paired bootstrap over questions: "
                    + reader_levers.format_difference(d))
        verdict = "holds" if d["EM"][1] > 0 else "negative"
    else:
        figure = f"{last} reader: tune chose w = 1 (ORQA/REALM's); dev EM {scored[last][1.0]['exact_match']:.3f}"
        interval, verdict = "", "negative"
    tune = scored[last]["tune"]
    figure += "; tune EM by w: " + ", ".join(f"{w:g}: {tune[f'exact_match@w={w:g}']:.3f}"
                                             for w in WEIGHTS)
    result_records.write(
        result_records.tagged("open-qa-block-choice-weight", tag), area="Open-QA", order=25, notebook=notebook,
        verdict=verdict,
        claim="Choosing the blocks' retrieval weight w in S_read + w·S_retr on the tune split picks better blocks than "
              f"ORQA/REALM's w = 1{f' (the {last} reader)' if tag else ''}",
        figure=figure, interval=interval)


if __name__ == "__main__":
    sys.exit(main())
