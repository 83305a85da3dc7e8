"""docs/guides/your_corpus.md, run as a user would: its own ```bash blocks, extracted from the markdown and run in
order in one shell, with only its settings (CONFIG, RUN and the step counts) set to the tiny config's, so that the
guide cannot drift from the code."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # a dozen realm-tf processes: `make test-fast` skips it

REPO = pathlib.Path(__file__).resolve().parents[2]
GUIDE = REPO / "docs" / "guides" / "your_corpus.md"
SETTINGS = {"CONFIG": "configs/tiny.yaml", "READER_STEPS": "2", "FINETUNE_STEPS": "2"}


def guide_blocks() -> list[str]:
    """The guide's ```bash blocks, in order."""
    return re.findall(r"```bash\n(.*?)```", GUIDE.read_text(encoding="utf-8"), flags=re.S)


def with_settings(script: str, run: str) -> str:
    """The guide's first block with its settings replaced (each must be defined there, once)."""
    for name, value in {**SETTINGS, "RUN": run}.items():
        script, count = re.subn(rf"^{name}=\S+", f"{name}={value}", script, flags=re.M)
        assert count == 1, f"the guide's first block defines {name} {count} times"
    return script


def test_the_guide_runs_as_written_and_its_model_answers(tmp_path):
    blocks = guide_blocks()
    assert len(blocks) >= 6
    script = "set -euo pipefail\n" + "\n".join([with_settings(blocks[0], str(tmp_path / "run")), *blocks[1:]])
    bin_dir = os.path.dirname(sys.executable)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", TF_CPP_MIN_LOG_LEVEL="3")
    if not os.path.exists(REPO / ".venv" / "bin" / "realm-tf"):  # the guide says .venv/bin/realm-tf, as make does
        script = script.replace(".venv/bin/realm-tf", f"{bin_dir}/realm-tf").replace(".venv/bin/python",
                                                                                    sys.executable)
    done = subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["num_questions"] > 0 and 0.0 <= metrics["exact_match"] <= 1.0
    served = sorted(p.name for p in (tmp_path / "run" / "served").iterdir() if p.name.isdigit())
    assert served == ["1"]
    lines = done.stdout.strip().splitlines()
    answers = [line[len("A: "):].split("    (")[0] for line in lines if line.startswith("A: ")]
    assert len(answers) == 1 and answers[0].strip(), done.stdout[-2000:]  # `ask` answered (2 steps: any span)
    from_python = [line[len("answer: "):].strip() for line in lines if line.startswith("answer: ")]
    assert from_python == [answers[0].strip()], done.stdout[-2000:]  # Answerer gives ask's answer
