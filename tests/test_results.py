"""``benchmarks/RESULTS.md`` is the rendering of ``benchmarks/records/*.json``: it cannot drift from them, every
record carries its evidence, and no result names a machine's absolute paths."""
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import result_records  # noqa: E402  (benchmarks/)


def _record(**changes):
    record = {"area": "Open-QA", "claim": "The reader reads.", "figure": "EM 0.5 on 10 questions",
              "command": ".venv/bin/python benchmarks/x.py", "commit": "abc1234", "machine": "2 vCPU x, AVX2",
              "date": "2026-11-26", "verdict": "holds"}
    record.update(changes)
    return {k: v for k, v in record.items() if v is not None}


def test_results_md_leads_with_its_headline_section():
    records = result_records.load_records()
    rendered = result_records.render(records)
    sections = [line for line in rendered.splitlines() if line.startswith("## ")]
    assert sections[0] == "## Headline"
    heads = [r["headline"] for _, r in records if r.get("headline")]
    assert 5 <= len(heads) == len(set(heads))
    top = rendered.split("## Headline", 1)[1].split("\n## ", 1)[0]
    assert all(f"| {h} |" in top for h in heads)


def test_a_superseded_record_names_an_existing_one_and_says_so(tmp_path):
    records = tmp_path / "records"
    records.mkdir()
    (records / "old.json").write_text(json.dumps(_record(claim="Old.", superseded_by="new")))
    (records / "new.json").write_text(json.dumps(_record(claim="New.")))
    rendered = result_records.render(result_records.load_records(str(records)))
    assert "| Old. | EM 0.5 on 10 questions | superseded by `new` |" in rendered
    (records / "old.json").write_text(json.dumps(_record(claim="Old.", superseded_by="gone")))
    with pytest.raises(ValueError, match="superseded_by names no record"):
        result_records.load_records(str(records))


def test_results_md_is_the_rendering_of_the_records():
    records = result_records.load_records()
    assert records, "no records in benchmarks/records/"
    rendered = result_records.render(records)
    assert (BENCHMARKS / "RESULTS.md").read_text(encoding="utf-8") == rendered, (
        "benchmarks/RESULTS.md is stale: run `python benchmarks/result_records.py`")
    assert len(rendered.splitlines()) <= 250
    claims = [record["claim"] for _, record in records]
    assert len(set(claims)) == len(claims), "two records make the same claim: one of them hides the other"
    for name, record in records:  # every claim is a row of its area's table, with its command
        section = rendered.split(f"## {record['area']}\n", 1)[1].split("\n## ", 1)[0]
        cell = "| " + result_records.table_cell(record["claim"]) + " |"
        row = next((line for line in section.splitlines() if line.startswith(cell)), None)
        assert row is not None, name
        assert record["commit"] in row and record["date"] in row


@pytest.mark.parametrize("change, message", [
    ({"claim": None}, "missing claim"),
    ({"area": "Misc"}, "area 'Misc'"),
    ({"verdict": "maybe"}, "verdict 'maybe'"),
    ({"commit": "HEAD"}, "not a git hash"),
    ({"date": "26/11/2026"}, "not YYYY-MM-DD"),
    ({"command": "python /work/main/benchmarks/x.py"}, "absolute path"),
    ({"figure": "see /tmp/run/log"}, "absolute path"),
    ({"seed": 1}, "unknown field"),
    ({"notebook": "no-such-entry.md"}, "not in benchmarks/notebook"),
    ({"figure": "EM 0.5, rerun in the next session"}, "tells how the work went"),
    ({"claim": "The reader reads, as #66 asked."}, "tells how the work went"),
    ({"interval": "one seed (issue 12)"}, "tells how the work went"),
    ({"notebook": "2026-11-24-issue-17-protocol.md"}, "named after how the work went"),
])
def test_a_malformed_record_is_refused_with_its_name_and_field(change, message):
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        result_records.validate(_record(**change), "records/bad.json")
    assert "records/bad.json" in str(raised.value)


def test_a_record_that_is_not_json_names_its_file_and_line(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(_record()))
    (tmp_path / "b.json").write_text('{"area": "Open-QA",\n "claim": }\n')
    with pytest.raises(ValueError, match=r"b\.json:2: not JSON"):
        result_records.load_records(str(tmp_path))


def test_write_fills_in_the_evidence_and_renders_again(tmp_path):
    results = tmp_path / "RESULTS.md"
    record = result_records.write("open-qa-x", area="Open-QA", claim="A claim.", figure="EM 0.5",
                                  records_dir=str(tmp_path / "records"), results_path=str(results),
                                  command=".venv/bin/python benchmarks/x.py --flag 1")
    assert re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", record["commit"]) and "vCPU" in record["machine"]
    assert json.loads((tmp_path / "records" / "open-qa-x.json").read_text()) == record
    first = results.read_text()
    assert "| A claim. | EM 0.5 | holds |" in first
    result_records.write("open-qa-x", area="Open-QA", claim="A claim.", figure="EM 0.6",
                         records_dir=str(tmp_path / "records"), results_path=str(results), command="make demo")
    assert "EM 0.6" in results.read_text() and "EM 0.5" not in results.read_text()  # replaced, not appended
    assert not [p for p in os.listdir(tmp_path / "records") if p.startswith(".tmp")]  # no partial files left


def test_no_result_or_notebook_entry_names_a_machine_path():
    pattern = result_records.MACHINE_PATH
    for path in [BENCHMARKS / "RESULTS.md", *sorted((BENCHMARKS / "notebook").glob("*.md"))]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            assert not pattern.search(line), f"{path.name}:{number}: {line.strip()[:120]}"


def test_the_recorded_command_names_no_machine_path():
    repo = str(BENCHMARKS.parent)
    command = result_records.invocation([f"{repo}/benchmarks/x.py", "--out", f"{repo}/runs/a", "--tmp",
                                         f"{tempfile.gettempdir()}/scratch", "--data=/work/elsewhere/d.jsonl"])
    assert command == (".venv/bin/python benchmarks/x.py --out runs/a --tmp '$TMPDIR/scratch' "
                       "'--data=<local>/elsewhere/d.jsonl'")
    result_records.validate(_record(command=command), "records/x.json")  # accepted


def test_commit_is_dirty_for_changed_code_not_for_the_records_a_benchmark_writes(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    (tmp_path / "benchmarks" / "records").mkdir(parents=True)
    for name in ("benchmarks/records/a.json", "benchmarks/RESULTS.md", "benchmarks/x.py"):
        (tmp_path / name).write_text("0\n")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "c")
    clean = result_records.commit(str(tmp_path / "benchmarks"))
    assert re.fullmatch(r"[0-9a-f]{7,40}", clean)
    (tmp_path / "benchmarks/records/a.json").write_text("1\n")
    (tmp_path / "benchmarks/RESULTS.md").write_text("1\n")
    assert result_records.commit(str(tmp_path / "benchmarks")) == clean
    (tmp_path / "benchmarks/x.py").write_text("1\n")
    assert result_records.commit(str(tmp_path / "benchmarks")) == clean + "+dirty"


def test_the_results_plots_read_their_points_from_the_records_figures():
    import results_plots  # noqa: E402  (benchmarks/)

    figure = "import: 1 B/block; 0.5M 1.4 GiB (model 1.4), 2 s; 4M 3.4 GiB (model 3.5) | ask: 0.25M 1.0 GiB, 7 s"
    assert results_plots.memory_points(figure, "import") == ([0.5, 4.0], [1.4, 3.4])
    assert results_plots.memory_points(figure, "ask") == ([0.25], [1.0])
    assert results_plots.dose_points("on/off: p 0.03: 2.090/2.101; p 1: 1.335/2.208; one seed") == (
        [0.03, 1.0], [2.09, 1.335], [2.101, 2.208])
