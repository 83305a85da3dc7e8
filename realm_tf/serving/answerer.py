"""Python API over an exported Open-QA SavedModel: ``Answerer(path).ask("question")``.

The same SavedModel TF Serving serves (:mod:`realm_tf.export.open_qa_export`); this class only loads it
(registering the tokenizer's and ScaNN's custom ops first) and turns its tensors into plain Python::

    from realm_tf.serving import answerer
    qa = answerer.Answerer("runs/minilm/served")   # a model base path: its newest complete version
    result = qa.ask("who wrote the lyrics of he ain't heavy he's my brother")
    print(result.answer, result.confidence, result.blocks[0].title)
    strict = answerer.Answerer("runs/minilm/served", min_confidence=0.8)   # abstains below 0.8: answer ""

The path is a model base path (``realm-tf export --base-path``: numbered versions, TF Serving's layout), whose
newest complete version is loaded, or one export directory. A version that cannot be loaded (a file missing,
truncated, or failing TensorFlow's checksum) is named in the error; under a base path the previous complete version
is served instead, with a warning, as TF Serving keeps serving the version it has.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Sequence

import tensorflow as tf

from realm_tf import artifacts
from realm_tf import errors
from realm_tf.export import serving_warmup

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Evidence:
    """One retrieved block: its title, text and retrieval score f(x, z)."""

    block_id: int
    title: str
    text: str
    score: float


@dataclasses.dataclass(frozen=True)
class Answer:
    """The answer span ("" when the model abstained), its probability among all spans of the read blocks
    (``score``), the probability that it is right (``confidence``; None from an export without one), the best
    candidate (given or not), and the blocks read."""

    question: str
    answer: str
    score: float
    blocks: tuple[Evidence, ...]
    served_by: str = ""  # the export version that answered
    confidence: float | None = None
    abstained: bool = False
    candidate: str = ""


@dataclasses.dataclass(frozen=True)
class ServedVersion:
    """One loaded export: its directory, its marker's metadata, the SavedModel and its serving signature."""

    path: str
    metadata: dict
    model: object
    serve: object


class Answerer:
    """Loads an Open-QA export once (the newest complete version of a model base path); :meth:`ask` answers
    questions with it. ``path`` is the version loaded, ``model`` the loaded SavedModel (all its signatures).
    With ``min_confidence`` > 0 it abstains (``answer`` "", ``abstained``) on the questions whose answer's
    ``confidence`` is below it, and still reports their best ``candidate``.

    Under a base path, :meth:`refresh` loads a newer complete version while the current one keeps answering,
    then swaps to it in one step (TF Serving's version policy "latest"): a request answers entirely from the
    version it started with, never from a version still being written (only complete ones are listed) nor
    from a damaged one (it is named in a warning and the current version kept)."""

    def __init__(self, export_path: str, min_confidence: float = 0.0):
        if not 0.0 <= min_confidence <= 1.0:
            raise errors.UserError(f"min_confidence {min_confidence}: a probability, in [0, 1]")
        self.min_confidence = float(min_confidence)
        export_path = export_path.rstrip("/")
        self.base_path: str | None = None
        if artifacts.is_complete(export_path, artifacts.OPEN_QA_EXPORT):
            candidates = [export_path]
        else:
            self.base_path = export_path
            artifacts.warn_incomplete_versions(export_path, artifacts.OPEN_QA_EXPORT, "Open-QA export")
            candidates = list(reversed(artifacts.complete_versions(export_path, artifacts.OPEN_QA_EXPORT).values()))
        if not candidates:
            raise errors.UserError(f"{export_path}: not a complete Open-QA export nor a model base path with one "
                                   f"(no {artifacts.OPEN_QA_EXPORT}; run `realm-tf export --base-path {export_path}`)")
        for number, path in enumerate(candidates):
            try:
                self._version = _load(path)
                break
            except errors.UserError as e:
                if number + 1 == len(candidates):
                    raise
                logger.warning("%s; serving the previous complete version, %s", e, candidates[number + 1])
        self._failed: set[str] = set()

    @property
    def path(self) -> str:
        return self._version.path

    @property
    def metadata(self) -> dict:
        return self._version.metadata

    @property
    def model(self) -> object:
        return self._version.model

    def refresh(self, warm_up: bool = True) -> bool:
        """Swaps to the newest complete version of the base path when it is newer than the one served (its
        warm-up requests replayed first, with ``warm_up``); True when it did. A newer version that cannot be
        loaded is logged once and skipped; the current one stays."""
        if self.base_path is None:
            return False
        versions = artifacts.complete_versions(self.base_path, artifacts.OPEN_QA_EXPORT)
        newer = [path for number, path in sorted(versions.items(), reverse=True)
                 if path not in self._failed and number > _number(self._version.path)]
        for path in newer:
            try:
                version = _load(path)
                if warm_up:
                    _warm_up(version)
            except (errors.UserError, ValueError, tf.errors.OpError) as e:
                self._failed.add(path)
                logger.warning("%s; still serving %s", e, self._version.path)
                continue
            self._version = version  # one reference: requests in flight keep the version they started with
            logger.info("serving %s", path)
            return True
        return False

    def warm_up(self) -> int:
        """Replays the export's TF Serving warm-up requests (``assets.extra``), as TF Serving does before a
        version takes traffic, so that a long-lived server's first questions find the graph initialised and its
        compiled programs built. Returns the number of requests replayed."""
        return _warm_up(self._version)

    def ask_batch(self, questions: Sequence[str]) -> list[Answer]:
        """Answers several questions in one call of the model."""
        if not questions:
            return []
        version = self._version  # the whole batch from one version, whatever refresh() does meanwhile
        text = tf.constant(list(questions), tf.string)
        if self.min_confidence > 0:
            selective = version.model.signatures.get(serving_warmup.SELECTIVE_SIGNATURE)
            if selective is None:
                raise errors.UserError(f"{version.path}: exported without answer confidence, so it cannot abstain "
                                       f"at min_confidence {self.min_confidence}: export the model again")
            raw = selective(question=text, min_confidence=tf.fill([len(questions)], self.min_confidence))
        else:
            raw = version.serve(question=text)
        out = {k: v.numpy() for k, v in raw.items()}
        results = []
        for i, question in enumerate(questions):
            blocks = tuple(Evidence(int(out["block_id"][i, j]), out["block_title"][i, j].decode("utf-8", "replace"),
                                    out["block_text"][i, j].decode("utf-8", "replace"), float(out["block_score"][i, j]))
                           for j in range(out["block_id"].shape[1]))
            answer = out["answer"][i].decode("utf-8", "replace")
            results.append(Answer(
                question, answer, float(out["score"][i]), blocks, version.path,
                confidence=float(out["confidence"][i]) if "confidence" in out else None,
                abstained=bool(out["abstained"][i]) if "abstained" in out else False,
                candidate=out["candidate"][i].decode("utf-8", "replace") if "candidate" in out else answer))
        return results

    def ask(self, question: str) -> Answer:
        """Answers one question."""
        return self.ask_batch([question])[0]


def _number(path: str) -> int:
    """The version number of a base path's version directory (-1 for a directory that is not numbered)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return int(name) if name.isdigit() else -1


def _warm_up(version: ServedVersion) -> int:
    """Replays ``version``'s warm-up requests; returns how many."""
    requests = serving_warmup.read_warmup_requests(version.path)
    for signature, inputs in requests:
        version.model.signatures[signature](**{name: tf.constant(value) for name, value in inputs.items()})
    return len(requests)


def _load(path: str) -> ServedVersion:
    """Loads the export at ``path``; a damaged one (a file missing, truncated or failing its checksum) is a
    UserError that names it."""
    try:
        metadata = artifacts.read_marker(path, artifacts.OPEN_QA_EXPORT, "Open-QA export")
        import tensorflow_text  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import  (tokenizer ops)
        if metadata.get("searcher") == "scann":
            import scann  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import  (ScaNN's ops)
        model = tf.saved_model.load(path)
        serve = model.signatures["serving_default"]
    except (errors.UserError, OSError, IndexError, ValueError, KeyError, tf.errors.OpError) as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise errors.UserError(f"{path}: the Open-QA export cannot be loaded ({type(e).__name__}: {first_line}): "
                               f"it is damaged. Export it again (realm-tf export), or delete {path} so that the "
                               f"previous complete version is served") from e
    return ServedVersion(path, metadata, model, serve)


def format_answer(result: Answer, snippet: int = 160) -> str:
    """Human-readable lines: the answer with its score, then the blocks read (title + snippet)."""
    confidence = "" if result.confidence is None else f"confidence {result.confidence:.3f}, "
    if result.abstained:
        head = f"A: (no answer: {confidence}below the threshold; best candidate: {result.candidate})"
    else:
        head = f"A: {result.answer}    ({confidence}score {result.score:.3f})"
    lines = [f"Q: {result.question}", head, "evidence:"]
    for rank, block in enumerate(result.blocks, 1):
        text = " ".join(block.text.split())
        lines.append(f"  {rank}. [{block.title}] (f={block.score:.2f}) "
                     f"{text[:snippet]}{'…' if len(text) > snippet else ''}")
    return "\n".join(lines)


def ask(model: str, questions: Sequence[str], snippet: int = 160, min_confidence: float = 0.0) -> list[str]:
    """``realm-tf ask``: answers ``questions`` with the Open-QA export at ``model`` (a model base path, whose newest
    complete version is served, or one export) and prints each answer (:func:`format_answer`), abstaining below
    ``min_confidence``; returns the answers ("" where it abstained)."""
    qa = Answerer(model, min_confidence=min_confidence)
    print(f"model: {qa.path}")
    results = qa.ask_batch(questions)
    for result in results:
        print(format_answer(result, snippet=snippet))
    return [result.answer for result in results]
