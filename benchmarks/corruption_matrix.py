"""Torn and corrupted files: every file of a published artifact truncated, bit-flipped or deleted, then read the
way a user reads it, from the command line.

Each case damages one file of one artifact of a tiny workspace (``benchmarks/crash_matrix.py``'s ``base``) in a copy
that also holds the previous complete version where the artifact is versioned, then runs the reader:

* the served model (``realm-tf ask --model``): a base path with a good version 1 and the damaged version 2, and
  the damaged version alone;
* the MIPS index (``realm-tf evaluate --index``): an index root with the good version and the damaged newer one,
  brute force and ScaNN (its serialized tree and asymmetric-hashing assets);
* the blocks (``realm-tf evaluate`` with ``data.blocks_dir`` the damaged corpus);
* the fine-tuning checkpoint (``realm-tf evaluate --model`` a run whose newest checkpoint is damaged).

The outcome of each case is one of: ``named`` (exit code 2, the damaged file or its directory named, no
traceback), ``fallback`` (exit code 0, the previous complete version used and a logged line naming the damaged
one), ``warned`` (exit code 0, the data read unchecked, with a logged line naming the damage: a blocks directory
that lost its manifest), ``undetected`` (exit code 0 and nothing said: the reader used the damaged data; for the
served model the answers are compared with the good version's) or ``crash`` (anything else). The goal: no
``undetected`` case that changes an answer and no ``crash``. Resumable::

    .venv/bin/python benchmarks/corruption_matrix.py --out runs/bench/corruption_matrix \
        --workspace runs/bench/crash_matrix/base
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Callable

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchmark_stages as stages  # noqa: E402  (benchmarks/)
import result_records  # noqa: E402  (benchmarks/)

DAMAGES = ("truncated", "flipped", "deleted")
OUTCOMES = ("named", "fallback", "warned", "undetected", "crash")
#: Words of the lines in which a reader says what it found damaged (a line that merely names the directory, such
#: as where the predictions went, does not count).
WARNINGS = ("damaged", "missing", "cannot be read", "skipped", "unchecked", "previous", "not a complete")


def damage(path: str, how: str) -> None:
    """Truncates ``path`` to half, flips every bit of its middle byte, or deletes it."""
    if how == "deleted":
        os.remove(path)
        return
    size = os.path.getsize(path)
    if how == "truncated":
        with open(path, "r+b") as f:
            f.truncate(size // 2)
        return
    with open(path, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0xFF]) if byte else b"\0")


def damages(path: str) -> tuple[str, ...]:
    """The damages that change ``path`` (an empty file cannot be truncated)."""
    return tuple(how for how in DAMAGES if not (how == "truncated" and os.path.getsize(path) == 0))


def damaged_copy(source: str, target: str, relative: str, how: str) -> str:
    """A fresh copy of the directory ``source`` at ``target`` with its file ``relative`` damaged; returns
    ``target``."""
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(source, target)
    damage(os.path.join(target, relative), how)
    return target


def run(argv: list[str]) -> tuple[int, str, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-m", "realm_tf.cli", *argv], capture_output=True, text=True, env=env,
                          check=False, timeout=900)
    return done.returncode, done.stdout, done.stderr


def outcome(code: int, stdout: str, stderr: str, names: tuple[str, ...], fell_back: bool) -> str:
    """One of :data:`OUTCOMES` for a reader's run (``names``: strings whose mention counts as naming the damage)."""
    last = (stderr.strip().splitlines() or [""])[-1]
    if code == 2 and any(n in last for n in names) and "Traceback" not in stderr:
        return "named"
    said = [line for line in stderr.splitlines() if any(n in line for n in names) and any(w in line for w in WARNINGS)]
    if code == 0 and said:
        return "fallback" if fell_back else "warned"
    if code == 0:
        return "undetected"
    return "crash"


def files_of(directory: str, marker: str) -> list[str]:
    """The files an artifact's marker lists, and the marker itself."""
    with open(os.path.join(directory, marker), encoding="utf-8") as f:
        listed = list(json.load(f).get("files", {}))
    return [*listed, marker]


def cases(base: str, work: str) -> list[tuple[str, str, str, Callable[[], dict[str, Any]]]]:
    """``(artifact, file, damage, run the case)`` for every file and damage."""
    params = os.path.join(base, "params.yaml")
    with open(os.path.join(base, "questions.jsonl"), encoding="utf-8") as f:
        question = json.loads(f.readline())["question"]
    evaluate = ["evaluate", "--config", params, "--questions", os.path.join(base, "questions.jsonl"), "--split", "dev"]
    good: dict[tuple[str, ...], dict[str, Any]] = {}

    def changed(result: tuple[int, str, str], sets: tuple[str, ...] = ()) -> bool:
        """Whether an evaluation that exited 0 scored differently from the undamaged workspace's."""
        if result[0] != 0:
            return False
        if sets not in good:
            good[sets] = _scores(run([*evaluate, *sets])[1])
        return _scores(result[1]) != good[sets]
    out = []

    def served_case(name: str, how: str) -> dict[str, Any]:
        root = os.path.join(work, "served")
        shutil.rmtree(root, ignore_errors=True)
        for version in ("1", "2"):
            shutil.copytree(os.path.join(base, "served"), os.path.join(root, version))
        damage(os.path.join(root, "2", name), how)
        good = run(["ask", question, "--model", os.path.join(root, "1")])
        through_base = run(["ask", question, "--model", root])
        alone = run(["ask", question, "--model", os.path.join(root, "2")])
        names = (os.path.join(root, "2"),)
        fell_back = f"model: {os.path.join(root, '1')}" in through_base[1]
        changed = through_base[0] == 0 and not fell_back and _answer(through_base[1]) != _answer(good[1])
        return {"base_path": outcome(*through_base, names, fell_back), "alone": outcome(*alone, names, False),
                "answer_changed": changed}

    for name in files_of(os.path.join(base, "served"), "realm_qa.json"):
        for how in damages(os.path.join(base, "served", name)):
            out.append(("served model", name, how, lambda name=name, how=how: served_case(name, how)))

    def index_case(name: str, how: str, index: str = "index", sets: tuple[str, ...] = ()) -> dict[str, Any]:
        root = os.path.join(work, "index")
        shutil.rmtree(root, ignore_errors=True)
        source = os.path.join(base, index, "0000000000")
        shutil.copytree(source, os.path.join(root, "0000000000"))
        newer = os.path.join(root, "0000000001")
        shutil.copytree(source, newer)
        with open(os.path.join(newer, "index.json"), encoding="utf-8") as f:
            meta = json.load(f)
        with open(os.path.join(newer, "index.json"), "w", encoding="utf-8") as f:
            json.dump({**meta, "version": 1}, f)
        damage(os.path.join(newer, name), how)
        result = run([*evaluate, "--index", root, *sets])
        fell_back = '"index_version": 0' in result[1]
        return {"evaluate": outcome(*result, (newer,), fell_back), "answer_changed": changed(result, sets)}

    for name in files_of(os.path.join(base, "index", "0000000000"), "index.json"):
        for how in damages(os.path.join(base, "index", "0000000000", name)):
            out.append(("index version", name, how, lambda name=name, how=how: index_case(name, how)))
    for name in files_of(os.path.join(base, SCANN_INDEX, "0000000000"), "index.json"):
        for how in damages(os.path.join(base, SCANN_INDEX, "0000000000", name)):
            out.append(("ScaNN index version", name, how,
                        lambda name=name, how=how: index_case(name, how, SCANN_INDEX, SCANN_SETS)))

    def checkpoint_case(name: str, how: str) -> dict[str, Any]:
        run_dir = damaged_copy(os.path.join(base, "finetune"), os.path.join(work, "finetune"),
                               os.path.join("checkpoints", name), how)
        result = run([*evaluate, "--model", run_dir])
        fell_back = f'"checkpoint": "{os.path.join(run_dir, "checkpoints", "ckpt-1")}"' in result[1]
        return {"evaluate": outcome(*result, (os.path.join(run_dir, "checkpoints"), run_dir), fell_back),
                "answer_changed": changed(result) and not fell_back}  # the previous checkpoint scores as it does

    for name in ("ckpt-4.data-00000-of-00001", "ckpt-4.index", "checkpoint"):
        for how in damages(os.path.join(base, "finetune", "checkpoints", name)):
            out.append(("checkpoint", name, how, lambda name=name, how=how: checkpoint_case(name, how)))

    def blocks_case(name: str, how: str) -> dict[str, Any]:
        blocks = damaged_copy(os.path.join(base, "blocks"), os.path.join(work, "blocks"), name, how)
        result = run([*evaluate, "--set", f"data.blocks_dir={blocks}"])
        return {"evaluate": outcome(*result, (blocks,), False), "answer_changed": changed(result)}

    for name in files_of(os.path.join(base, "blocks"), "manifest.json"):
        for how in damages(os.path.join(base, "blocks", name)):
            out.append(("blocks", name, how, lambda name=name, how=how: blocks_case(name, how)))
    return out


#: A ScaNN index version of the workspace's blocks (tree + asymmetric hashing: the assets ScaNN serializes), and
#: the settings that read it.
SCANN_INDEX = "index_scann"
SCANN_SETS = ("--set", "index.kind=scann", "--set", "index.num_leaves=4", "--set", "index.num_leaves_to_search=4")


def build_scann_index(base: str) -> None:
    """``<base>/index_scann``: the workspace's blocks embedded by its retriever export into a ScaNN index."""
    code, _, stderr = run(["embed-blocks", "--config", os.path.join(base, "params.yaml"), "--index-dir",
                           os.path.join(base, SCANN_INDEX), "--export-dir", os.path.join(base, "export"),
                           "--progress-interval", "0", *SCANN_SETS])
    if code != 0:
        raise RuntimeError(f"embed-blocks (ScaNN) failed: {stderr[-2000:]}")


def _scores(stdout: str) -> dict[str, Any]:
    """The metrics line ``realm-tf evaluate`` prints, without what names the inputs (checkpoint, index version)."""
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            return {k: v for k, v in json.loads(line).items() if k not in ("checkpoint", "index_version")}
    return {}


def _answer(stdout: str) -> str:
    return next((line for line in stdout.splitlines() if line.startswith("A: ")), "")


def write_artifact_records(rows: list[tuple[str, str, str, dict[str, Any]]]) -> None:
    """One RESULTS row per artifact: for each reader, how many damaged files ended in each outcome."""
    artifacts = list(dict.fromkeys(artifact for artifact, _, _, _ in rows))
    for order, artifact in enumerate(artifacts):
        mine = [(name, how, r) for a, name, how, r in rows if a == artifact]
        readers = list(dict.fromkeys(k for _, _, r in mine for k in r if k != "answer_changed"))
        tallies = {reader: {o: sum(r.get(reader) == o for _, _, r in mine) for o in OUTCOMES} for reader in readers}
        undetected = sorted({f"{name} {how}" for name, how, r in mine
                             if any(r.get(reader) == "undetected" for reader in readers)})
        changed = sum(bool(r.get("answer_changed")) for _, _, r in mine)
        files = len({name for name, _, _ in mine})
        result_records.write(
            f"corruption-matrix-{order:02d}-{artifact.replace(' ', '-')}", area="Crash consistency and load",
            order=12, verdict="holds" if all(t["crash"] == 0 for t in tallies.values()) and not changed else "open",
            claim=f"Each file of the {artifact} truncated, bit-flipped or deleted: its reader names it or falls back "
                  "to the previous complete version, and never serves a changed answer",
            figure=f"{len(mine)} damaged copies ({files} files truncated, bit-flipped or deleted; an empty file is not "
                   "truncated); "
                   + "; ".join(f"{reader}: " + ", ".join(f"{n} {o}" for o, n in t.items() if n)
                               for reader, t in tallies.items())
                   + (f"; undetected: {', '.join(undetected)}" if undetected else "")
                   + (f"; answers changed: {changed}" if any("answer_changed" in r for _, _, r in mine) else ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", default="runs/bench/corruption_matrix")
    parser.add_argument("--workspace", default="runs/bench/crash_matrix/base")
    args = parser.parse_args()
    out = args.out.rstrip("/")
    stage = stages.Stages(out)
    work = os.path.join(out, "work")
    stage("scann_index", lambda: build_scann_index(args.workspace))
    rows = []
    for artifact, name, how, fn in cases(args.workspace, work):
        result = stage(f"{artifact}|{name}|{how}", fn)
        rows.append((artifact, name, how, result))
        print(f"  {artifact} / {name} / {how}: {result}", flush=True)
    print("\n== corruptions x readers x outcome ==")
    print("| artifact | file | damage | reader: outcome |")
    print("| --- | --- | --- | --- |")
    tally = {o: 0 for o in OUTCOMES}
    changed = 0
    for artifact, name, how, result in rows:
        outcomes = {k: v for k, v in result.items() if k != "answer_changed"}
        for value in outcomes.values():
            tally[value] += 1
        changed += bool(result.get("answer_changed"))
        print(f"| {artifact} | {name} | {how} | " + ", ".join(f"{k}: {v}" for k, v in outcomes.items()) + " |")
    print("\nstage minutes: " + stage.minutes())
    write_artifact_records(rows)
    result_records.write(
        "corruption-matrix", area="Crash consistency and load", order=12,
        verdict="holds" if tally["crash"] == 0 and changed == 0 else "open",
        claim="Every file of a served model, an index version, a checkpoint and the blocks truncated, bit-flipped or "
              "deleted ends, for its reader on the command line, in an error naming it (exit code 2, no traceback) "
              "or a fallback to the previous complete version with a logged line; never a changed answer",
        figure=f"{len(rows)} damaged files; reader runs: " + ", ".join(f"{n} {o}" for o, n in tally.items())
               + f"; answers changed by undetected damage: {changed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
