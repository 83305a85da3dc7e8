"""The README is for a newcomer: one screen of what the project is and how to run it, and a short table of
results, each with its setting and caveat; the links in it resolve."""
import pathlib
import re

REPO = pathlib.Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def results_rows() -> list[str]:
    section = README.split("## Results", 1)[1].split("\n## ", 1)[0]
    return [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| ---")][1:]


def test_the_readme_is_short():
    lines = README.splitlines()
    assert len(lines) <= 120, len(lines)
    long = [n for n, line in enumerate(lines, 1) if len(line) > 120]
    assert not long, f"README lines over 120 characters: {long}"


def test_the_results_table_has_at_most_ten_rows_of_at_most_25_words():
    rows = results_rows()
    assert 1 <= len(rows) <= 10, len(rows)
    for row in rows:
        words = re.sub(r"\[→\]\[\w+\]", "", row).replace("|", " ").split()
        assert len(words) <= 25, (len(words), row)
        assert row.count(" | ") == 3, f"a row has result, figure, setting and caveat: {row}"
        caveat = re.sub(r"\[→\]\[\w+\]", "", row.strip().strip("|").split(" | ")[3]).strip()
        assert caveat, f"a row's caveat cell holds more than its link: {row}"


def test_the_readme_links_resolve():
    targets = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README) + re.findall(r"^\[\w+\]: ([^#\s]+)", README, re.M)
    for target in targets:
        if not target.startswith("http"):
            assert (REPO / target).exists(), target


def test_the_readme_names_its_two_commands_first():
    first_block = README.split("```", 2)[1]
    assert "make demo" in first_block and "make test" in first_block
