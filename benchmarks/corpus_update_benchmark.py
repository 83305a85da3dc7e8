"""Updating the knowledge (issue #19): 100 passages added and 100 deleted on the whole bundled corpus with the MiniLM
config, from ``realm-tf update-corpus`` to a new served version, next to the full rebuild it replaces
(``preprocess`` + ``embed-blocks`` + ``export`` of the edited corpus), printed side by side.

The corpus: the bundled passages without 100 held-out ones (every passage whose SHA1(id) is among the 100
smallest), preprocessed, embedded (a MiniLM retriever export) and exported as ``served/1``; the update adds the
100 held-out passages (new text, never embedded) and deletes 100 others. Every command runs as a user runs it, in
its own process (``benchmarks/benchmark_stages.cli``), and is timed from start to exit. Stages are recorded in
``<out>/stages.json`` and skipped on a rerun, so a stopped run continues where it stopped::

    nohup .venv/bin/python benchmarks/corpus_update_benchmark.py --out runs/corpus_update \\
        > runs/corpus_update.log 2>&1 &
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)
from realm_tf import config as config_lib  # noqa: E402

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)


def split_corpus(passages: str, out: str, changes: int) -> dict[str, Any]:
    """Writes ``base.jsonl`` (all but ``changes`` held-out passages), ``new.jsonl`` (those), ``deleted.txt``
    (``changes`` ids of the base, the next ones by SHA1) and ``edited.jsonl`` (base - deleted + new)."""
    with gzip.open(passages, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    order = sorted(rows, key=lambda row: hashlib.sha1(str(row["id"]).encode()).hexdigest())
    new, deleted = order[:changes], {str(row["id"]) for row in order[changes:2 * changes]}
    held_out = {str(row["id"]) for row in new}
    base = [row for row in rows if str(row["id"]) not in held_out]
    edited = [row for row in base if str(row["id"]) not in deleted] + new
    for name, part in (("base.jsonl", base), ("new.jsonl", new), ("edited.jsonl", edited)):
        with open(os.path.join(out, name), "w", encoding="utf-8") as f:
            f.writelines(json.dumps(row) + "\n" for row in part)
    with open(os.path.join(out, "deleted.txt"), "w", encoding="utf-8") as f:
        f.writelines(doc_id + "\n" for doc_id in sorted(deleted))
    return {"base": len(base), "new": len(new), "deleted": len(deleted), "edited": len(edited)}


def export_retriever(config: str, overrides: list[str], out: str) -> None:
    """The imported MiniLM retriever (a random projection) saved as a run and exported as step 0, so that the
    served model's Embed_input and the index's Embed_doc are the same towers."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from realm_tf.export import retriever_export  # pylint: disable=import-outside-toplevel
    from realm_tf.models import knowledge_retriever  # pylint: disable=import-outside-toplevel

    cfg = config_lib.load_config(config, overrides)
    retriever = knowledge_retriever.build_knowledge_retriever(cfg.model)
    tf.train.Checkpoint(model=retriever).save(os.path.join(out, "retriever", "checkpoints", "ckpt"))
    retriever_export.export_retriever(retriever, cfg, 0)


def timed(args: list[str]) -> float:
    """Seconds from the start to the exit of ``realm-tf ARGS`` in its own process."""
    start = time.time()
    stages.cli(args)
    return round(time.time() - start, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/minilm.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[])
    parser.add_argument("--out", default="runs/corpus_update", help="run directory (recreated stage by stage)")
    parser.add_argument("--passages", default="data/open_qa/passages.jsonl.gz")
    parser.add_argument("--changes", type=int, default=100, help="passages added, and passages deleted")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)

    def sets(name: str) -> list[str]:
        """The config of the ``base`` (then updated) or the ``full`` (rebuilt) system: own blocks, index, exports."""
        overrides = [f"data.blocks_dir={out}/{name}/blocks", f"index.index_dir={out}/{name}/index",
                     f"refresh.export_dir={out}/export", f"finetune.model_dir={out}/finetune",
                     f"qa.retriever_checkpoint={out}/retriever", "model.projection_init=random", *args.overrides]
        return ["--config", args.config, *sum((["--set", o] for o in overrides), [])]

    cfg = config_lib.load_config(args.config, sets("base")[3::2])
    print(f"config: {args.config} (blocks of <= {cfg.data.max_block_length} wordpieces, {cfg.index.kind} index, "
          f"projection {cfg.model.projection_size}), os.cpu_count {os.cpu_count()}", flush=True)
    stage = stages.Stages(out)
    counts = stage("split", lambda: split_corpus(args.passages, out, args.changes))
    stage("retriever", lambda: export_retriever(args.config, sets("base")[3::2], out))
    # The system before the change, built the usual way (these timings are a second full rebuild, for reference).
    base = {"preprocess": stage("base_preprocess", lambda: timed(
                ["preprocess", *sets("base"), "--input", f"{out}/base.jsonl", "--output", f"{out}/base/blocks"])),
            "embed-blocks": stage("base_embed", lambda: timed(["embed-blocks", *sets("base")])),
            "export": stage("base_export", lambda: timed(["export", *sets("base"), "--base-path", f"{out}/served"]))}
    update = stage("update", lambda: timed(
        ["update-corpus", *sets("base"), "--add", f"{out}/new.jsonl", "--delete", f"@{out}/deleted.txt",
         "--serve", f"{out}/served"]))
    full = {"preprocess": stage("full_preprocess", lambda: timed(
                ["preprocess", *sets("full"), "--input", f"{out}/edited.jsonl", "--output", f"{out}/full/blocks"])),
            "embed-blocks": stage("full_embed", lambda: timed(["embed-blocks", *sets("full")])),
            "export": stage("full_export", lambda: timed(
                ["export", *sets("full"), "--base-path", f"{out}/served_full"]))}

    from realm_tf import artifacts  # pylint: disable=import-outside-toplevel
    from realm_tf.data import corpus_versions  # pylint: disable=import-outside-toplevel

    manifest = artifacts.read_marker(corpus_versions.current_dir(f"{out}/base/blocks"), artifacts.JOB_MANIFEST)
    full_blocks = artifacts.read_marker(f"{out}/full/blocks", artifacts.JOB_MANIFEST)["blocks"]
    served = artifacts.newest_complete(f"{out}/served", artifacts.OPEN_QA_EXPORT)
    total_full = sum(full.values())
    print(f"\n== corpus update vs full rebuild: {counts['base']:,} passages, +{counts['new']} new, "
          f"-{counts['deleted']} deleted ({args.config}, os.cpu_count {os.cpu_count()}) ==")
    print(f"{'step':<48}{'full rebuild':>14}{'update':>10}")
    for name in ("preprocess", "embed-blocks", "export"):
        print(f"{name:<48}{full[name]:>13.1f}s{'-':>10}")
    print(f"{'update-corpus --serve (to a new served version)':<48}{'-':>14}{update:>9.1f}s")
    print(f"{'total':<48}{total_full:>13.1f}s{update:>9.1f}s   update = {100 * update / total_full:.1f}% of full")
    print(f"blocks embedded: full {full_blocks:,}, update {manifest['blocks_embedded']:,} "
          f"({manifest['blocks_reused']:,} reused; documents {manifest['documents']}); corpus {manifest['blocks']:,} "
          f"blocks after the update; served: {served}")
    print("the base system built the same way: " + ", ".join(f"{k} {v:.1f}s" for k, v in base.items()))
    print(f"stage minutes: {stage.minutes()}")
    result_records.write(
        "knowledge-update-vs-rebuild", area="Knowledge updates", order=10,
        verdict="holds" if update < total_full / 10 and manifest["blocks_embedded"] < full_blocks else "negative",
        claim=f"Adding {counts['new']} passages and deleting {counts['deleted']} embeds only the new blocks and serves "
              "a new version in a small fraction of a full rebuild's time.",
        figure=f"update-corpus --serve {update:.1f} s vs full rebuild {total_full:.1f} s "
               f"({100 * update / total_full:.1f}%); {manifest['blocks_embedded']:,} blocks embedded vs "
               f"{full_blocks:,}; {os.cpu_count()} cores (load {os.getloadavg()[0]:.1f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
