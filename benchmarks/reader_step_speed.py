"""How fast the reader warm start trains here, against another commit: seconds per step, paired step by step.

The reader warm start (``realm-tf train-reader``: the span reader on gold blocks, REALM/ORQA's reader, Guu et al.,
2020, §3.2) is most of ``make demo``'s minutes and of the reader benchmarks' hours, so a change meant to speed up
training is measured on it. Both commits train the same reader on the same data in the same order (the demo's
sample of the bundled questions and SQuAD paragraphs, its blocks, MiniLM, batch 8, two length groups, one thread
per op on 2 cores, mixed bfloat16 where the CPU has it); their runs take turns (``--pairs`` pairs), and each run's
``steps_per_second`` (TensorBoard, every 5 steps) is compared at the same step: the mean over steps from
``--from-step`` on, and how many of the paired intervals were faster.

Each commit's runs start in its own checkout (the other commit's a ``git worktree`` under ``--out``), whose
``realm_tf`` they import (checked). Resumable (``<out>/stages.json``)::

    .venv/bin/python benchmarks/reader_step_speed.py --out runs/bench/reader_step_speed --against 298a0bf
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import config as config_lib  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)
import scalar_windows  # noqa: E402  (benchmarks/)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHILD = """
import os, sys
import realm_tf
from realm_tf import config as config_lib
from realm_tf.tasks import reader_warm_start
if not realm_tf.__file__.startswith(os.getcwd() + os.sep):
    sys.exit(f"realm_tf imported from {realm_tf.__file__}, not from the checkout {os.getcwd()}")
cfg = config_lib.load_config("configs/minilm.yaml", sys.argv[2:])
reader_warm_start.train_reader(cfg, sys.argv[1].split(","))
"""


def prepare(out: str) -> dict[str, str]:
    """The demo's sample of the bundled data and its blocks, under ``out``."""
    from beam_jobs import preprocess_corpus  # pylint: disable=import-outside-toplevel
    from realm_tf import demo  # pylint: disable=import-outside-toplevel

    cfg = config_lib.load_config("configs/minilm.yaml")
    paths = {name: f"{out}/{name}.jsonl" for name in ("corpus", "questions", "squad")}
    demo.sample_corpus(cfg, paths["corpus"], paths["questions"], paths["squad"], num_questions=800,
                       squad_paragraphs=None)
    preprocess_corpus.JOB.call(config="configs/minilm.yaml", input=[paths["corpus"]], output=f"{out}/blocks")
    return {**paths, "blocks": f"{out}/blocks"}


def train(root: str, data: dict[str, str], model_dir: str, steps: int, precision: str) -> None:
    """``steps`` reader warm-start steps with the code of ``root`` (a checkout), into ``model_dir``."""
    sets = [f"data.blocks_dir={data['blocks']}", f"reader.model_dir={model_dir}", f"reader.steps={steps}",
            "reader.max_minutes=0", "reader.warmup_steps=5", "reader.learning_rate=3e-4",
            "reader.summary_every_steps=5",
            "reader.checkpoint_every_steps=100000", f"reader.precision={precision}", "data.batch_size=8",
            "model.reader_length_buckets=2", f"reader.intra_op_threads={1 if (os.cpu_count() or 1) <= 2 else 0}",
            "qa.reader_checkpoint=", "qa.reader_negatives=0"]
    env = {**os.environ, "PYTHONPATH": root, "TF_CPP_MIN_LOG_LEVEL": "2"}
    # ``-c`` puts the working directory first on the path: the checkout's realm_tf, checked by the child
    subprocess.run([sys.executable, "-c", CHILD, f"{data['squad']},{data['questions']}", *sets], cwd=root, env=env,
                   check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", default="runs/bench/reader_step_speed")
    parser.add_argument("--against", required=True, help="the other commit (any git revision)")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--from-step", dest="from_step", type=int, default=15, help="first step compared (the "
                        "first steps trace and warm up)")
    parser.add_argument("--pairs", type=int, default=2)
    args = parser.parse_args()
    out = os.path.abspath(args.out.rstrip("/"))
    stage = stages.Stages(out)
    from realm_tf import process_settings  # pylint: disable=import-outside-toplevel

    precision = "mixed_bfloat16" if process_settings.native_bfloat16() else "float32"
    data = stage("data", lambda: prepare(out))
    against = subprocess.run(["git", "rev-parse", "--short", args.against], cwd=REPO, check=True, text=True,
                             capture_output=True).stdout.strip()
    other = f"{out}/checkout-{against}"
    stage(f"checkout_{against}", lambda: subprocess.run(["git", "worktree", "add", "--force", "--detach", other,
                                                         against], cwd=REPO, check=True).returncode)
    arms = {"here": REPO, against: other}
    for pair in range(args.pairs):
        for arm, root in arms.items():
            stage(f"train_{arm}_{pair}", lambda root=root, arm=arm, pair=pair: train(
                root, data, f"{out}/runs/{arm}_{pair}", args.steps, precision))
    rates = {(arm, pair): scalar_windows.read_scalars(f"{out}/runs/{arm}_{pair}/train")["steps_per_second"]
             for arm in arms for pair in range(args.pairs)}
    compared = sorted(s for s in rates["here", 0] if s >= args.from_step)
    mean = {arm: sum(rates[arm, p][s] for p in range(args.pairs) for s in compared) / (args.pairs * len(compared))
            for arm in arms}
    faster = sum(rates["here", p][s] > rates[against, p][s] for p in range(args.pairs) for s in compared)
    total = args.pairs * len(compared)
    for arm in arms:
        print(f"{arm:>10s}: " + " | ".join(" ".join(f"{s}:{rates[arm, p][s]:.3f}" for s in compared)
                                           for p in range(args.pairs)) + f"  mean {mean[arm]:.3f} steps/s")
    print(f"here {1 / mean['here']:.3f} s/step, {against} {1 / mean[against]:.3f} s/step; {faster} of {total} "
          f"paired intervals faster here")
    print("stage minutes: " + stage.minutes())
    result_records.write(
        "speed-reader-warm-start-step", area="Speed and memory", order=53,
        verdict="holds" if mean["here"] > mean[against] and faster > total / 2 else "negative",
        claim=f"The reader warm start trains faster per step than at {against} (same data, same order, MiniLM, "
              f"batch 8, {precision}).",
        figure=f"{1 / mean['here']:.3f} s/step against {1 / mean[against]:.3f} ({mean['here'] / mean[against]:.2f}x "
               f"steps/s), steps {args.from_step}-{args.steps} of {args.pairs} interleaved pairs of runs",
        interval=f"{faster} of {total} paired 5-step intervals faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
