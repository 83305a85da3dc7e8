"""Library code cites papers, not the project's history: no issue numbers, RESULTS parts or session references in
realm_tf/ or beam_jobs/, and no timings (they go stale; a measured figure's place is docs/performance.md and the
results, which the code may point to)."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"issues? #\d+|\(#\d+\)|\bRESULTS(?:\.md)?,? part \d+|\bpart \d+ of RESULTS|\bsession \d+\b",
                     re.IGNORECASE)
#: A timing measured on some machine: milliseconds, a rate, seconds set against seconds, a count of page faults.
MEASURED = re.compile(r"\b\d+(?:\.\d+)? ?(?:ms|µs|GFLOP/s)\b|\b\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? s against\b"
                      r"|\bmillion (?:minor )?page faults\b")


def test_no_history_references_in_library_code():
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for top in ("realm_tf", "beam_jobs") for path in sorted((REPO / top).rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if HISTORY.search(line) or MEASURED.search(line)]
    assert not found, "\n".join(found)


def test_the_pattern_finds_what_it_is_for():
    for line in ("(issue #20, part 9)", "issues #15 §2 and #20", "benchmarks/RESULTS.md part 8", "in session 26",
                 "fixed in (#41)"):
        assert HISTORY.search(line), line
    for line in ("REALM (Guu et al., 2020, §3.4)", "RETRO §2.6", "part of the retriever", "a session of the trainer"):
        assert not HISTORY.search(line), line


def test_the_timing_pattern_finds_measurements_not_arithmetic():
    for line in ("took 17 ms for 2 ms of matmul", "in 106 s against 112-115 s", "at 228 GFLOP/s",
                 "about 150 million minor page faults", "(2.1 ms against 0.45 ms)"):
        assert MEASURED.search(line), line
    for line in ("13M x 128 floats are 6.8 GB", "BERT's 15% of a query", "f\"{seconds:.1f} ms\"", "poll every 2 s",
                 "attention probabilities are 157 MB"):
        assert not MEASURED.search(line), line
