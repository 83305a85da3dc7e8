"""The bundled reading-comprehension set (``data/reading/``): every question reads through the project's question
reader, names a bundled paragraph, and has its answers verbatim in that paragraph (what the reader warm start's
gold blocks rely on)."""
import glob
import gzip
import json
import pathlib

from realm_tf.data import questions

READING = pathlib.Path(__file__).resolve().parents[2] / "data" / "reading"


def _passages() -> dict[str, dict]:
    passages: dict[str, dict] = {}
    for path in sorted(glob.glob(str(READING / "squad_train_passages-*-of-00002.jsonl.gz"))):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            for line in f:
                row = json.loads(line)
                assert row["id"] not in passages, f"{path}: passage id {row['id']} twice"
                assert row["title"].strip() and row["text"].strip(), row["id"]
                passages[row["id"]] = row
    return passages


def test_squad_train_questions_name_bundled_paragraphs_that_hold_their_answers():
    passages = _passages()
    assert len(passages) == 18_896
    assert len({p["title"] for p in passages.values()}) == 442
    squad = questions.read_questions(str(READING / "qa_squad_train.jsonl.gz"))
    assert len(squad) == 87_636 and len({q.id for q in squad}) == len(squad)
    used = set()
    for question in squad:
        assert len(question.gold_passage_ids) == 1 and question.answers, question.id
        text = passages[question.gold_passage_ids[0]]["text"]
        assert all(answer and answer in text for answer in question.answers), question.id
        used.add(question.gold_passage_ids[0])
    assert used == set(passages)  # no paragraph without a question


def test_an_article_is_in_one_shard():
    titles = []
    for path in sorted(glob.glob(str(READING / "squad_train_passages-*-of-00002.jsonl.gz"))):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            titles.append({json.loads(line)["title"] for line in f})
    assert len(titles) == 2 and not titles[0] & titles[1]
