"""The accelerator contract, job by job, as results: for each training job, whether its step compiles as one XLA
program, whether 2 MirroredStrategy replicas train it to the weights of one device, and how it trains in
mixed_bfloat16 and mixed_float16. Each cell is a test of ``make test`` (run here, on CPU, with pytest), or a
named exemption with its reason; one record per job renders the table in RESULTS.md.

    .venv/bin/python benchmarks/accelerator_contract.py --record

Nothing here runs on a GPU or a TPU: the tests check on CPU what an accelerator needs (static shapes, no string
or float64 in a batch, one compiled program per step, equal replicas, loss scaling).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ElementTree

import result_records  # noqa: E402  (benchmarks/)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REALM, READER = "tests/tasks/test_realm_pretraining.py", "tests/tasks/test_reader_warm_start.py"
OPEN_QA, ICT, RETRO = "tests/tasks/test_open_qa.py", "tests/tasks/test_ict.py", "tests/retro/test_retro_lm.py"
XLA, REPLICAS = "test_the_step_is_one_xla_program_traced_once", "test_two_replicas_train_as_one"
LOSS_SCALING = ("tests/core/test_precision.py::"
                "test_mixed_float16_skips_an_overflowing_step_halves_the_scale_and_grows_it_back")
LR_SCALES = "tests/core/test_optimizer_replicas.py::test_every_replica_takes_the_scale_of_its_variables_path"
#: mixed_float16 is one optimizer wrapper (a LossScaleOptimizer) that every job's step goes through
#: (``training_loop.minimize``): its test is the same for every job.
FLOAT16 = ("loss scaling (every job's update goes through the same LossScaleOptimizer)", [LOSS_SCALING])
ICT_EXEMPT = ("exempt: each replica draws its negatives from its own batch, so 2 replicas of b/2 optimise "
              "another loss than one device with b (Lee et al., 2019 score each query against the whole batch)")


@dataclasses.dataclass(frozen=True)
class Job:
    """One row: the job and, per column, what the cell means and the tests (node ids) that must pass."""

    name: str
    order: int
    xla: tuple[str, list[str]]
    replicas: tuple[str, list[str]]
    bfloat16: tuple[str, list[str]]
    float16: tuple[str, list[str]] = FLOAT16


JOBS = (
    Job("ICT", 1, ("float32 and mixed_bfloat16", [f"{ICT}::{XLA}[float32]", f"{ICT}::{XLA}[mixed_bfloat16]"]),
        (ICT_EXEMPT, []), ("under XLA", [f"{ICT}::{XLA}[mixed_bfloat16]"])),
    Job("REALM pre-training, retriever frozen", 2, ("mixed_bfloat16", [f"{REALM}::{XLA}[True-mixed_bfloat16]"]),
        ("AdamW, 3 steps", [f"{REALM}::{REPLICAS}[True]", LR_SCALES]),
        ("under XLA", [f"{REALM}::{XLA}[True-mixed_bfloat16]"])),
    Job("REALM pre-training, retriever trained", 3, ("float32", [f"{REALM}::{XLA}[False-float32]"]),
        ("AdamW, 3 steps, each replica's share in 2 parts (gradient accumulation)",
         [f"{REALM}::{REPLICAS}[False]", LR_SCALES]),
        ("uncompiled: the float32 loss within bfloat16 rounding, and it trains",
         [f"{REALM}::test_a_mixed_bfloat16_model_gives_a_float32_loss_close_to_float32_and_trains"])),
    Job("reader warm start", 4, ("float32", [f"{READER}::{XLA}"]),
        ("AdamW, 3 steps, each replica's share in 2 parts", [f"{READER}::{REPLICAS}", LR_SCALES]),
        ("uncompiled: computes in bfloat16 and keeps float32 checkpoints",
         [f"{READER}::test_mixed_bfloat16_reader_computes_in_bfloat16_and_trains_float32_checkpoints"])),
    Job("Open-QA fine-tuning", 5, ("float32: the update; the search and the corpus gathers run before it, "
                                   "uncompiled", [f"{OPEN_QA}::{XLA}"]),
        ("AdamW, 3 steps, each replica's share in 2 parts", [f"{OPEN_QA}::{REPLICAS}", LR_SCALES]),
        ("not tested: no test trains Open-QA in bfloat16 (test_a_mixed_precision_model_is_checked_against_the_"
         "index_in_float32 only checks a bfloat16 model's block scores against the float32 index)", [])),
    Job("RETRO, retrieval off", 6, ("float32", [f"{RETRO}::{XLA}[False-float32]"]),
        ("AdamW, 3 steps", [f"{RETRO}::{REPLICAS}[False]", LR_SCALES]),
        ("not alone: the retrieval-on test compiles the same decoder layers in mixed_bfloat16",
         [f"{RETRO}::{XLA}[True-mixed_bfloat16]"])),
    Job("RETRO, retrieval on", 7, ("mixed_bfloat16", [f"{RETRO}::{XLA}[True-mixed_bfloat16]"]),
        ("AdamW, 3 steps, each replica's share in 2 parts", [f"{RETRO}::{REPLICAS}[True]", LR_SCALES]),
        ("under XLA", [f"{RETRO}::{XLA}[True-mixed_bfloat16]"])),
)
COLUMNS = (("compiles with XLA", "xla"), ("2 replicas = 1 replica", "replicas"), ("mixed_bfloat16", "bfloat16"),
           ("mixed_float16", "float16"))


def node_ids() -> list[str]:
    """Every test a cell names, once, in the table's order."""
    seen: dict[str, None] = {}
    for job in JOBS:
        for _, attribute in COLUMNS:
            seen.update(dict.fromkeys(getattr(job, attribute)[1]))
    return list(seen)


def run_tests(nodes: list[str], junit: str) -> None:
    """pytest over ``nodes`` (one process; the slow ones included), its results in the JUnit file ``junit``."""
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rP", f"--junitxml={junit}",
               "-o", "junit_logging=system-out", *nodes]
    print("$ " + " ".join(command[1:]), flush=True)
    subprocess.run(command, cwd=REPO, check=False)


def outcomes(junit: str) -> dict[str, tuple[str, str]]:
    """``{node id: (passed | failed | skipped, its printed output)}`` from a JUnit file."""
    found = {}
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        node = f"{module}.py::{case.get('name')}"
        state = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                state = "failed"
            elif child.tag == "skipped":
                state = "skipped"
        found[node] = (state, "".join((c.text or "") for c in case if c.tag == "system-out"))
    return found


def _largest_difference(printed: str) -> str:
    """The replica test's printed report: ``largest difference D`` (or "" when it printed none)."""
    for line in reversed(printed.splitlines()):
        if line.startswith("{") and "max_difference" in line:
            report = json.loads(line)
            return f"largest difference {report['max_difference']:.1e} against updates of {report['moved']:.1e}"
    return ""


def cell(meaning: str, nodes: list[str], results: dict[str, tuple[str, str]]) -> tuple[str, bool]:
    """The cell's text and whether it holds: every named test passed (an exemption or "not tested" holds no
    test and says so)."""
    if not nodes:
        return meaning, not meaning.startswith("not tested")
    states = [results.get(n, ("not run", ""))[0] for n in nodes]
    extra = [d for d in (_largest_difference(results.get(n, ("", ""))[1]) for n in nodes) if d]
    held = all(s == "passed" for s in states)
    verdict = "passes" if held else "FAILS (" + ", ".join(f"{n.split('::')[-1]}: {s}" for n, s in zip(nodes, states)
                                                         if s != "passed") + ")"
    names = ", ".join(n.split("::")[-1] for n in nodes)
    return f"{verdict}: {meaning}{'; ' + extra[0] if extra else ''} [{names}]", held


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junit", default="", help="read the outcomes from this JUnit file (e.g. of `make test "
                        "PYTEST_ARGS='--junitxml=F -o junit_logging=system-out'`) instead of running the tests")
    parser.add_argument("--at-commit", default="", help="with --junit: the commit the JUnit file's tests ran at")
    parser.add_argument("--record", action="store_true", help="write one result record per job")
    args = parser.parse_args()
    junit = args.junit
    if not junit:
        junit = os.path.join(tempfile.mkdtemp(prefix="accelerator-contract-"), "junit.xml")
        run_tests(node_ids(), junit)
    results = outcomes(junit)
    command = ("make test PYTEST_ARGS='--junitxml=J -o junit_logging=system-out' && .venv/bin/python "
               "benchmarks/accelerator_contract.py --junit J --record") if args.junit else ""
    for job in JOBS:
        cells = [(title, *cell(*getattr(job, attribute), results)) for title, attribute in COLUMNS]
        figure = " · ".join(f"{title}: {text}" for title, text, _ in cells)
        print(f"{job.name}\n  " + "\n  ".join(f"{title}: {text}" for title, text, _ in cells), flush=True)
        if args.record:
            slug = job.name.lower().replace(",", "").replace(" ", "-")
            result_records.write(
                f"accelerator-contract-{slug}", area="Accelerators", order=job.order,
                claim=f"{job.name}: the step trains as a GPU or TPU needs it to (checked on CPU; never run on an "
                      f"accelerator)", figure=figure, verdict="holds" if all(h for _, _, h in cells) else "open",
                command=command, at_commit=args.at_commit)
    return 0


if __name__ == "__main__":
    sys.exit(main())
