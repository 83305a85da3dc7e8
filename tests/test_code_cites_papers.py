"""Library code cites papers, not the project's history: no issue numbers, RESULTS parts or session references in
realm_tf/ or beam_jobs/ (they go stale; a measured figure's place is the results, which the code may point to by
the benchmark that measures it)."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
HISTORY = re.compile(r"issues? #\d+|\(#\d+\)|\bRESULTS(?:\.md)?,? part \d+|\bpart \d+ of RESULTS|\bsession \d+\b",
                     re.IGNORECASE)


def test_no_history_references_in_library_code():
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for top in ("realm_tf", "beam_jobs") for path in sorted((REPO / top).rglob("*.py"))
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if HISTORY.search(line)]
    assert not found, "\n".join(found)


def test_the_pattern_finds_what_it_is_for():
    for line in ("(issue #20, part 9)", "issues #15 §2 and #20", "benchmarks/RESULTS.md part 8", "in session 26",
                 "fixed in (#41)"):
        assert HISTORY.search(line), line
    for line in ("REALM (Guu et al., 2020, §3.4)", "RETRO §2.6", "part of the retriever", "a session of the trainer"):
        assert not HISTORY.search(line), line
