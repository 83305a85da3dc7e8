"""``realm_tf.demo``'s corpus subset: which passages and questions the demo reads (the whole loop runs in
tests/integration/test_demo.py)."""
import gzip
import json
import pathlib
import sys

from realm_tf import config as config_lib
from realm_tf import demo
from realm_tf.data import question_split

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import demo_fresh_clone  # noqa: E402  (benchmarks/)


def _write_gz(path, rows):
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)


def _bundle(tmp_path):
    passages = [{"id": i, "title": f"t{i}", "text": f"passage {i}"} for i in range(40)]
    questions = [{"id": f"q{i}", "question": f"q {i}?", "answers": ["a"], "gold_passage_ids": [i]}
                 for i in range(10)]
    # SQuAD: several questions per paragraph (10..15), one question whose paragraph spans two passages (16, 17).
    squad = [{"id": f"s{i}", "question": f"s {i}?", "answers": ["a"], "gold_passage_ids": [10 + i // 3]}
             for i in range(18)] + [{"id": "s18", "question": "s?", "answers": ["a"], "gold_passage_ids": [16, 17]}]
    _write_gz(tmp_path / "passages.jsonl.gz", passages)
    _write_gz(tmp_path / "qa_qed_train.jsonl.gz", questions)
    _write_gz(tmp_path / "qa_squad_dev.jsonl.gz", squad)
    return config_lib.load_config("configs/tiny.yaml", [
        f"data.corpus_pattern={tmp_path}/passages.jsonl.gz", f"data.qa_train={tmp_path}/qa_qed_train.jsonl.gz"])


def _read(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _subset(tmp_path, cfg, num_questions, squad_paragraphs):
    out = [str(tmp_path / name) for name in ("corpus.jsonl", "questions.jsonl", "squad.jsonl")]
    stats = demo.sample_corpus(cfg, *out, num_questions, squad_paragraphs)
    return stats, *(_read(path) for path in out)


def test_all_squad_paragraphs_by_default(tmp_path):
    cfg = _bundle(tmp_path)
    stats, corpus, questions, squad = _subset(tmp_path, cfg, 6, None)
    numbers = [int(q["id"][1:]) for q in questions]
    assert len(numbers) == len(set(numbers)) == 6 and numbers == sorted(numbers)  # in file order, no repeats
    assert numbers != list(range(6))  # a sample of the whole file, not its first questions
    again = tmp_path / "again"
    again.mkdir()
    assert _subset(again, cfg, 6, None)[2] == questions  # the same sample every run
    gold = set(numbers)
    assert len(squad) == 19 and stats["squad_questions"] == 19
    ids = [p["id"] for p in corpus]
    assert len(ids) == len(set(ids)) == stats["passages"]
    # the sample's gold passages, then as many other passages (the SQuAD paragraphs are read, not indexed)
    assert gold <= set(ids) and set(ids[:6]) == gold
    assert len(ids) == 6 + 6
    dev = sum(question_split.is_dev(q["id"], cfg.data.qa_dev_fraction) for q in questions)
    assert stats["dev"] == dev


def test_squad_paragraphs_caps_the_paragraphs(tmp_path):
    cfg = _bundle(tmp_path)
    stats, corpus, _, squad = _subset(tmp_path, cfg, 4, 2)
    # the questions of paragraphs 10 and 11 (three each), and no more
    assert [q["id"] for q in squad] == [f"s{i}" for i in range(6)]
    assert stats["squad_questions"] == 6
    ids = [p["id"] for p in corpus]
    assert len(ids) == len(set(ids)) == 4 + 4
    _, _, _, none = _subset(tmp_path, cfg, 4, 0)
    assert none == []


def test_the_closing_table_is_what_the_fresh_clone_record_reads():
    cfg = config_lib.load_config("configs/tiny.yaml", ["reader.steps=800", "finetune.steps=20",
                                                       "reader.precision=mixed_bfloat16"])
    metrics = {"num_questions": 83, "exact_match": 0.349, "f1": 0.504, "accuracy@5": 0.988, "predictions": "p.jsonl",
               "short_answers": {"num_questions": 58, "exact_match": 0.5, "f1": 0.59},
               "selective": {"aurc": {"value": 0.42, "low": 0.3, "high": 0.5}}}
    results = {"corpus": {"passages": 1590}, "evaluate": metrics, "ask": {"questions": ["who?"], "answers": ["x"]}}
    text = demo.summary(results, cfg, "runs/demo", 19.3, int(4.1 * 2 ** 30), 196.0)
    table = demo_fresh_clone.demo_table(text.splitlines())
    assert table == {"questions": "83", "em": "0.349", "f1": "0.504", "accuracy@5": "0.988",
                     "steps": f"pre-training {cfg.pretrain.steps}, reader 800, fine-tuning 20 (the reader in "
                              "mixed_bfloat16, the rest in float32)",
                     "minutes": "19.3", "peak_gib": "4.10"}
    assert text.splitlines()[-1].endswith(' ask --model runs/demo/served "who?"')
    assert "  confidence            uncalibrated span probability (83 held-out questions: too few to fit one); " \
           "AURC 0.420\n" in text
