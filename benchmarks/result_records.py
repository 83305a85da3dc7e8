"""Results as records: each figure in ``RESULTS.md`` is a JSON file in ``benchmarks/records/``, rendered.

A record states one claim and its evidence::

    {"area": "Open-QA", "claim": "...", "figure": "EM 0.354, F1 0.451 (1,081 dev questions)",
     "interval": "95% paired bootstrap ...",              # optional: where noise can decide
     "command": ".venv/bin/python benchmarks/...",         # what reproduces it
     "commit": "d670a93", "machine": "2 vCPU AMD EPYC 7B13, AVX2", "date": "2026-11-26",
     "verdict": "holds",                                  # holds | negative | open
     "notebook": "2026-11-26-open-qa-part-4-....md",     # optional: the dated entry with the details
     "order": 10,                                         # optional: place within its area
     "headline": "Open-QA EM, dense retriever",           # optional: a row of the headline section too
     "superseded_by": "open-qa-dense-dev-em-2",           # optional: the record that replaces this one
     "plot": "2026-11-28-reader-curve.png"}               # optional: its picture, in benchmarks/notebook/

A benchmark calls :func:`write` with the claim and the figure; the command, commit, machine and date are filled
in from the run, the record is written atomically, and ``RESULTS.md`` is rendered again, so the two cannot
disagree (``tests/test_results.py`` fails when they do). ``python benchmarks/result_records.py`` renders by hand
(after editing a record); ``--check`` exits 1 when ``RESULTS.md`` is stale.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RECORDS_DIR = os.path.join(HERE, "records")
RESULTS_PATH = os.path.join(HERE, "RESULTS.md")
#: Areas in the order RESULTS.md shows them; a record names one of them.
AREAS = ("Open-QA", "REALM pre-training", "Retrieval and the MIPS index", "Data pipeline", "RETRO and kNN-LM",
         "Knowledge updates", "Google's release", "Speed and memory", "Accelerators", "Crash consistency and load",
         "Tests and the demo")
VERDICTS = ("holds", "negative", "open")
REQUIRED = ("area", "claim", "figure", "command", "commit", "machine", "date", "verdict")
OPTIONAL = ("interval", "notebook", "order", "headline", "superseded_by", "plot")
#: How the work went is not a result: no issue, session or stop numbers in what a record says.
WORK_HISTORY = re.compile(r"\b(?:issue|stop)\s*#?\d+\b|\bsessions?\b|#\d{2,}\b", re.IGNORECASE)
#: Absolute paths of a machine (a record must not name them: they mean nothing on another one).
MACHINE_PATH = re.compile(r"(?<![\w.$])/(?:work|tmp|home|root|opt|Users|mnt)/")


def validate(record: dict[str, Any], name: str) -> None:
    """Raises ValueError naming ``name`` and the field when ``record`` is not a well-formed record."""
    missing = [k for k in REQUIRED if not str(record.get(k, "")).strip()]
    if missing:
        raise ValueError(f"{name}: missing {', '.join(missing)}")
    unknown = sorted(set(record) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ValueError(f"{name}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(REQUIRED + OPTIONAL)})")
    if record["area"] not in AREAS:
        raise ValueError(f"{name}: area {record['area']!r} is not one of {', '.join(AREAS)}")
    if record["verdict"] not in VERDICTS:
        raise ValueError(f"{name}: verdict {record['verdict']!r} is not one of {', '.join(VERDICTS)}")
    if not re.fullmatch(r"[0-9a-f]{7,40}(\+dirty)?", record["commit"]):
        raise ValueError(f"{name}: commit {record['commit']!r} is not a git hash")
    if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", record["date"]):
        raise ValueError(f"{name}: date {record['date']!r} is not YYYY-MM-DD")
    for key, value in record.items():
        if isinstance(value, str) and MACHINE_PATH.search(value):
            raise ValueError(f"{name}: {key} names a machine's absolute path ({value!r}); use repo-relative paths")
    for key in ("claim", "figure", "interval", "headline"):
        found = WORK_HISTORY.search(str(record.get(key, "")))
        if found:
            raise ValueError(f"{name}: {key} tells how the work went ({found.group(0)!r}); state the result only")
    for key in ("notebook", "plot"):  # a file RESULTS.md links to: its name is read as well
        if re.search(r"\b(?:issue|session|stop)s?[-_ ]?\d+", str(record.get(key, "")), re.IGNORECASE):
            raise ValueError(f"{name}: {key} {record[key]!r} is named after how the work went; name it after "
                             f"its result")
    if record.get("plot") and not os.path.exists(os.path.join(HERE, "notebook", record["plot"])):
        raise ValueError(f"{name}: plot {record['plot']!r} is not in benchmarks/notebook/")
    if record.get("notebook") and not os.path.exists(os.path.join(HERE, "notebook", record["notebook"])):
        raise ValueError(f"{name}: notebook entry {record['notebook']!r} is not in benchmarks/notebook/")


def load_records(records_dir: str = RECORDS_DIR) -> list[tuple[str, dict[str, Any]]]:
    """``[(name, record)]`` of every ``*.json`` in ``records_dir``, validated, in file-name order."""
    out = []
    for name in sorted(os.listdir(records_dir)):
        if not name.endswith(".json"):
            continue
        path = os.path.join(records_dir, name)
        try:
            with open(path, encoding="utf-8") as f:
                record = json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{e.lineno}: not JSON ({e.msg})") from e
        validate(record, path)
        out.append((name[:-len(".json")], record))
    names = {name for name, _ in out}
    for name, record in out:
        if record.get("superseded_by") and record["superseded_by"] not in names:
            raise ValueError(f"{name}: superseded_by names no record ({record['superseded_by']!r})")
        if record.get("superseded_by") and record.get("headline"):
            raise ValueError(f"{name}: a superseded record is not a headline")
    return out


def tagged(name: str, tag: str) -> str:
    """A record's name for a run with other settings beside the first (``name-tag``; ``name`` without a tag)."""
    return f"{name}-{tag}" if tag else name


def table_cell(text: str) -> str:
    """``text`` as one cell of a markdown table row: on one line, its pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def render(records: list[tuple[str, dict[str, Any]]]) -> str:
    """RESULTS.md from ``records``: one table per area, each row a claim, its figure and its evidence."""
    by_area: dict[str, list[tuple[str, dict[str, Any]]]] = {a: [] for a in AREAS}
    for name, record in records:
        by_area[record["area"]].append((name, record))
    lines = ["# Results", "",
             "What realm_tf achieves, measured on the bundled data, one row per claim. Each row gives the figure, "
             "the command that measures it, the commit, the machine and the date. A *negative* row is a result "
             "that did not hold, kept with its reason; an *open* row is measured but not yet at its goal.",
             "",
             "This file is rendered from `benchmarks/records/*.json` by `python benchmarks/result_records.py` "
             "(benchmarks write their records themselves); do not edit it by hand. The dated working log, with "
             "the details and every negative result, is in [notebook/](notebook/README.md).", ""]
    lines += headline(records)
    lines += [f"- [{area}](#{_anchor(area)}) ({len(rows)})" for area, rows in by_area.items() if rows]
    for area, rows in by_area.items():
        if not rows:
            continue
        lines += ["", f"## {area}", "", "| claim | figure | verdict | evidence |", "| --- | --- | --- | --- |"]
        for name, r in sorted(rows, key=lambda nr: (nr[1].get("order", 100), nr[0])):
            figure = r["figure"] + (f" ({r['interval']})" if r.get("interval") else "")
            evidence = (f"`{table_cell(r['command'])}` · {r['commit']} · {table_cell(r['machine'])} · {r['date']}"
                        + (f" · [notes](notebook/{r['notebook']})" if r.get("notebook") else ""))
            verdict = f"superseded by `{r['superseded_by']}`" if r.get("superseded_by") else r["verdict"]
            lines.append(f"| {table_cell(r['claim'])} | {table_cell(figure)} | {verdict} | {evidence} |")
        plots = [r for _, r in sorted(rows, key=lambda nr: (nr[1].get("order", 100), nr[0])) if r.get("plot")]
        for r in plots:
            lines += ["", f"![{table_cell(r.get('headline') or r['claim'])}](notebook/{r['plot']})"]
    return "\n".join(lines) + "\n"


def headline(records: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """The headline section's lines: the records marked ``headline``, one row each, by area then order."""
    rows = sorted((r for _, r in records if r.get("headline")),
                  key=lambda r: (AREAS.index(r["area"]), r.get("order", 100), r["headline"]))
    if not rows:
        return []
    lines = ["## Headline", "", "The current best figure of each part, one row each; the area's table has its "
             "evidence and the ablations beside it.", "", "| result | figure | verdict | area |",
             "| --- | --- | --- | --- |"]
    lines += [f"| {table_cell(r['headline'])} | {table_cell(r['figure'])} | {r['verdict']} | "
              f"[{r['area']}](#{_anchor(r['area'])}) |" for r in rows]
    return lines + [""]


def _anchor(title: str) -> str:
    return re.sub(r"[^a-z0-9 -]", "", title.lower()).replace(" ", "-")


def machine() -> str:
    """``<cores> vCPU <model>, <vector extensions>``: what a figure on this machine was measured on."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and ":" in line:
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and ":" in line:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    vector = "AVX-512" + ("+BF16" if "avx512_bf16" in flags else "") + ("+AMX" if "amx_tile" in flags else "") \
        if "avx512f" in flags else ("AVX2" if "avx2" in flags else "no AVX2")
    return f"{os.cpu_count()} vCPU {model}, {vector}"


def commit(checkout: str = HERE) -> str:
    """The checkout's short commit, ``+dirty`` when tracked files differ from it (the records and ``RESULTS.md``
    aside: a benchmark that writes several records must not mark its own later ones dirty)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=checkout, capture_output=True, text=True, check=True).stdout.strip()
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ":(top)", ":(top,exclude)benchmarks/records",
                  ":(top,exclude)benchmarks/RESULTS.md")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if changed else "")


def invocation(argv: list[str] | None = None) -> str:
    """The command that ran this benchmark, repo-relative: ``.venv/bin/python benchmarks/x.py --flag v``."""
    argv = list(sys.argv if argv is None else argv)
    repo = os.path.dirname(HERE)
    script = os.path.relpath(os.path.abspath(argv[0]), repo) if argv else ""
    return " ".join([".venv/bin/python", shlex.quote(script), *(shlex.quote(_portable(a, repo)) for a in argv[1:])])


def _portable(argument: str, repo: str) -> str:
    """``argument`` without this machine's absolute paths: the checkout's become repo-relative, the temporary
    directory's ``$TMPDIR``, the home directory's ``~``, and any other under a machine root ``<local>``, so that the
    record validates and means the same on another machine."""
    for prefix, replacement in ((repo + os.sep, ""), (repo, "."), (tempfile.gettempdir() + os.sep, "$TMPDIR/"),
                                (os.path.expanduser("~") + os.sep, "~/")):
        argument = argument.replace(prefix, replacement)
    return MACHINE_PATH.sub("<local>/", argument)


def write(name: str, *, area: str, claim: str, figure: str, verdict: str = "holds", interval: str = "",
          notebook: str = "", order: int | None = None, command: str = "", records_dir: str = RECORDS_DIR,
          results_path: str = RESULTS_PATH, at_commit: str = "") -> dict[str, Any]:
    """Writes ``records_dir/<name>.json`` (atomically: a reader sees the old record or the new one) with this
    run's command, commit (``at_commit``: of the checkout that ran, when that is not this one), machine and
    date, then renders ``results_path`` again. Returns the record."""
    record: dict[str, Any] = {"area": area, "claim": claim, "figure": figure, "command": command or invocation(),
                              "commit": at_commit or commit(), "machine": machine(),
                              "date": datetime.date.today().isoformat(), "verdict": verdict}
    if interval:
        record["interval"] = interval
    if notebook:
        record["notebook"] = notebook
    if order is not None:
        record["order"] = order
    validate(record, os.path.join(records_dir, name + ".json"))
    os.makedirs(records_dir, exist_ok=True)
    _atomic_write(os.path.join(records_dir, name + ".json"), json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    _atomic_write(results_path, render(load_records(records_dir)))
    return record


def _atomic_write(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-" + os.path.basename(path))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when RESULTS.md is not the records' rendering")
    args = parser.parse_args()
    try:
        rendered = render(load_records())
    except ValueError as e:
        print(f"result_records: {e}", file=sys.stderr)
        return 2
    if args.check:
        with open(RESULTS_PATH, encoding="utf-8") as f:
            stale = f.read() != rendered
        if stale:
            print(f"{RESULTS_PATH} is stale: run `python benchmarks/result_records.py`", file=sys.stderr)
        return int(stale)
    _atomic_write(RESULTS_PATH, rendered)
    print(f"rendered {RESULTS_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
