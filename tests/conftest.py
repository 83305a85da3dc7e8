"""Shared test set-up: tf-models needs Keras 2 (tf_keras), chosen before TensorFlow is first imported; and a
tiny REALM workspace (real bundled passages run through the real data jobs) for the training and serving tests."""
import gzip
import itertools
import json
import os
import pathlib
import sys

import pytest

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
if "PYTEST_XDIST_WORKER" in os.environ:
    # `make test` runs two workers on two cores: each TensorFlow process (a worker, and the CLI children it starts)
    # runs an op on one thread, so that the two do not hand each other's op pieces back and forth (TensorFlow's
    # own intra-op pool has one thread per core). Tests of the pool size start their children without it.
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
if str(REPO / "tests") not in sys.path:  # the helper modules of tests/ (tests are not a package), by bare name
    sys.path.insert(1, str(REPO / "tests"))
os.chdir(REPO)  # configs name bundled data by repo-relative paths

import shuffled_order  # noqa: E402  (tests/, on sys.path above)

from beam_jobs import build_chunk_database  # noqa: E402  (after TF_USE_LEGACY_KERAS is set)
from realm_tf import library_logs  # noqa: E402

library_logs.show_on_stderr()  # as the command line does: the library's messages on (captured) stderr

TINY = "configs/tiny.yaml"


@pytest.fixture(scope="session")
def portable_runner():
    """Beam options that run a job through Beam's portable runner API, the path Flink, Spark and Dataflow (Runner
    v2) take: a job service and SDK workers started in this process (``--job_endpoint=embed``, LOOPBACK)."""
    return ["--runner=PortableRunner", "--job_endpoint=embed", "--environment_type=LOOPBACK"]


@pytest.fixture(scope="session", autouse=True)
def scratch_under_basetemp(tmp_path_factory):
    """Scratch files the libraries make with :mod:`tempfile` (Beam's pipeline temp dirs, AutoGraph's generated
    modules, child processes' temp files) go under pytest's base temp dir, which pytest rotates, instead of
    piling up in the machine's ``/tmp`` run after run; so do compiled XLA programs (``process_settings``)."""
    import tempfile

    scratch = str(tmp_path_factory.mktemp("scratch"))
    previous = tempfile.tempdir, os.environ.get("TMPDIR")
    tempfile.tempdir = scratch
    os.environ["TMPDIR"] = scratch
    os.environ.setdefault("TF_XLA_FLAGS", f"--tf_xla_persistent_cache_directory={scratch}/xla")
    yield scratch
    tempfile.tempdir = previous[0]
    if previous[1] is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = previous[1]


@pytest.fixture(scope="session")
def workspace_overrides():
    """``overrides(root, shared)``: a tiny config on the shared blocks/examples, per-test index/export/model."""
    return lambda root, shared: [f"data.blocks_dir={shared}/blocks", f"data.pretraining_dir={shared}/pretraining",
            f"index.index_dir={root}/index", f"refresh.export_dir={root}/export", f"pretrain.model_dir={root}/model",
            "data.batch_size=2", "data.shuffle_buffer=8", "pretrain.warmup_steps=0", "pretrain.eval_examples=4",
            "refresh.poll_seconds=0.2"]


def _built_once(tmp_path_factory, name, build):
    """A session fixture's result built once for the whole run, not once per xdist worker: ``build(directory)``
    runs in the first worker that asks, under a file lock in the directory the workers share (pytest's base temp
    dir of the run), and its JSON result is read by every later one. Without xdist it is built in this process's
    own temp dir. What is built is read, never changed, by the tests."""
    import fcntl

    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    shared = tmp_path_factory.getbasetemp().parent
    with open(shared / f"{name}.lock", "w", encoding="utf-8") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or when a worker dies holding it
        done = shared / f"{name}.json"
        if done.exists():
            return json.loads(done.read_text(encoding="utf-8"))
        directory = shared / name
        if directory.exists():  # a worker died while building it
            import shutil

            shutil.rmtree(directory)
        directory.mkdir()
        result = build(directory)
        done.write_text(json.dumps(result), encoding="utf-8")
        return result


@pytest.fixture(scope="session")
def pretraining_workspace(tmp_path_factory):
    """``(shared_dir)`` holding ``blocks/`` (80 passages) and ``pretraining/`` (salient-span examples)."""
    return pathlib.Path(_built_once(tmp_path_factory, "realm_shared", _build_pretraining_workspace))


def _build_pretraining_workspace(shared):
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        lines = list(itertools.islice(f, 80))
    with open(shared / "corpus.jsonl", "w") as f:
        f.writelines(lines)
    # pylint: disable=import-outside-toplevel  (after TF_USE_LEGACY_KERAS is set)
    from beam_jobs import generate_pretraining_data
    from beam_jobs import preprocess_corpus

    sets = [f"data.blocks_dir={shared}/blocks", f"data.pretraining_dir={shared}/pretraining"]
    preprocess_corpus.JOB.call(config=TINY, overrides=sets, input=[str(shared / "corpus.jsonl")],
                               output=str(shared / "blocks"))
    generate_pretraining_data.JOB.call(config=TINY, overrides=sets)
    assert os.listdir(shared / "pretraining")
    return str(shared)


@pytest.fixture(scope="session")
def tiny_bert_checkpoint(tmp_path_factory):
    """A TF checkpoint prefix of a (random) tiny-config BERT: fixed weights every process can restore."""
    return _built_once(tmp_path_factory, "tiny_bert", _build_tiny_bert_checkpoint)


def _build_tiny_bert_checkpoint(directory):
    import tensorflow as tf

    from realm_tf import config
    from realm_tf.networks import bert_encoder
    from realm_tf.networks import bert_weight_import

    encoder = bert_encoder.build_bert_encoder(config.load_config(TINY).model.encoder)
    bert_weight_import.ensure_built(encoder)
    return tf.train.Checkpoint(encoder=encoder).write(str(directory / "bert"))


@pytest.fixture(scope="session")
def parse_records():
    """``parse(serialized, spec) -> [ {feature: value} ]``: serialized tf.Examples as plain Python rows (lists for
    numeric and ragged features, bytes for strings), for comparing job outputs with expectations."""
    return _parse_records


def _parse_records(serialized, spec):
    import tensorflow as tf

    if len(serialized) == 0:
        return []
    parsed = tf.io.parse_example(tf.constant(list(serialized)), dict(spec))
    rows = []
    for i in range(len(serialized)):
        row = {}
        for key, value in parsed.items():
            v = value[i]
            v = v.numpy() if hasattr(v, "numpy") else v  # bytes for string scalars, ndarray otherwise
            row[key] = v.tolist() if hasattr(v, "tolist") else v
        rows.append(row)
    return rows


@pytest.fixture(scope="session")
def read_scalars():
    """``read(logdir) -> {tag: [(step, value), ...]}`` of the TensorBoard scalars under ``logdir``."""
    return _read_scalars


@pytest.fixture(scope="session")
def progress_totals():
    """``totals(stderr, job) -> {unit: count}``: what a Beam job's progress lines (``job_support.Progress``)
    last reported, summed over the DoFn instances (pids); the main unit under "done"."""
    return _progress_totals


def _progress_totals(stderr, job):
    import re

    last = {}
    for line in stderr.splitlines():
        found = re.match(rf"{job} \[(?:[^\]]*, )?pid (\d+)\] ([\d,]+)[ /].*?/s(.*)$", line)
        if found:
            extra = dict((m[1], int(m[0].replace(",", ""))) for m in re.findall(r", ([\d,]+) (\w+)", found[3]))
            last[found[1]] = {"done": int(found[2].replace(",", "")), **extra}
    totals = {}
    for counts in last.values():
        for key, value in counts.items():
            totals[key] = totals.get(key, 0) + value
    return totals


def _read_scalars(logdir):
    import glob

    import tensorflow as tf

    out = {}
    for path in sorted(glob.glob(os.path.join(str(logdir), "events.out.tfevents.*"))):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, float(tf.make_ndarray(value.tensor))))
    return {k: sorted(v) for k, v in out.items()}


def pytest_addoption(parser):
    parser.addoption("--shuffled", action="store_true",
                     help="run the tests in a shuffled order, with a new seed printed at the start and the end")
    parser.addoption("--test-order-seed", type=int, default=None,
                     help="run the tests in the shuffled order of this seed (implies --shuffled)")


class _OrderSeedToWorkers:
    """xdist's hook: every worker collects the tests in the order the controller's seed gives (xdist requires all
    workers to collect the same list)."""

    def __init__(self, seed: int):
        self.seed = seed

    def pytest_configure_node(self, node):
        node.workerinput["test_order_seed"] = self.seed


def pytest_configure(config):
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None:
        config.test_order_seed = workerinput["test_order_seed"]
        return
    seed = config.getoption("--test-order-seed")
    if seed is None and config.getoption("--shuffled"):
        seed = int.from_bytes(os.urandom(4), "little")
    config.test_order_seed = seed  # None: the collection order
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_OrderSeedToWorkers(config.test_order_seed), "test-order-seed")


def _order_line(config) -> str:
    if config.test_order_seed is None:
        return "test order: as collected (--shuffled shuffles it)"
    return f"test order: shuffled with seed {config.test_order_seed} (rerun it with --test-order-seed " \
           f"{config.test_order_seed})"


def pytest_report_header(config):
    return _order_line(config)


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # pylint: disable=unused-argument
    terminalreporter.write_line(_order_line(config))  # also under -q, which prints no header


def pytest_collection_modifyitems(config, items):
    items[:] = shuffled_order.shuffled(items, config.test_order_seed)


@pytest.fixture(scope="session")
def corpus_vocabulary(tmp_path_factory, pretraining_workspace):
    """The tiny workspace's passages over the wordpieces they use: ``(root, --set overrides)``, where ``root``
    holds ``vocab.txt`` (MiniLM's vocabulary cut to those pieces and the special tokens, in its order), a tiny
    BERT over it (``bert/bert``) and the passages preprocessed with it (``blocks/``).

    WordPiece's greedy longest match finds the same pieces in the cut vocabulary (each piece MiniLM's chose is
    kept, and no longer one exists), so the texts are tokenized as before, over about 3,000 ids instead of 30,522.
    The RETRO decoder predicts over the vocabulary (tied embeddings, RETRO §2.4): its softmax was most of a
    training step's time."""
    root, sets = _built_once(tmp_path_factory, "corpus_vocabulary",
                             lambda root: _build_corpus_vocabulary(root, pretraining_workspace))
    return pathlib.Path(root), sets


def _build_corpus_vocabulary(root, pretraining_workspace):
    import tensorflow as tf

    from beam_jobs import preprocess_corpus
    from realm_tf import config
    from realm_tf.data import corpus_vocabulary
    from realm_tf.networks import bert_encoder
    from realm_tf.networks import bert_weight_import

    vocab_file = config.load_config(TINY).model.vocab_file
    with open(pretraining_workspace / "corpus.jsonl", encoding="utf-8") as f:
        texts = [value for line in f for value in json.loads(line).values() if isinstance(value, str)]
    # The same pieces, only renumbered.
    vocab = corpus_vocabulary.write_cut_vocabulary(vocab_file, texts, str(root / "vocab.txt"))
    sets = [f"model.vocab_file={root}/vocab.txt", f"model.encoder.vocab_size={len(vocab)}",
            f"data.blocks_dir={root}/blocks"]
    encoder = bert_encoder.build_bert_encoder(config.load_config(TINY, sets).model.encoder)
    bert_weight_import.ensure_built(encoder)
    tf.train.Checkpoint(encoder=encoder).write(str(root / "bert" / "bert"))
    preprocess_corpus.JOB.call(config=TINY, overrides=sets, input=[str(pretraining_workspace / "corpus.jsonl")],
                               output=str(root / "blocks"))
    return str(root), sets


@pytest.fixture(scope="session")
def retro_sets(tmp_path_factory, corpus_vocabulary):
    """A tiny RETRO chunk database (m = 8, n = 32) over the workspace's passages, in the corpus's own vocabulary:
    ``(root, --set overrides)``."""
    root, sets = _built_once(tmp_path_factory, "retro", lambda root: _build_retro_sets(root, corpus_vocabulary))
    return pathlib.Path(root), sets


def _build_retro_sets(root, corpus_vocabulary):
    vocabulary, vocabulary_sets = corpus_vocabulary
    sets = vocabulary_sets + [
        f"retro.chunks_dir={root}/chunks", f"retro.index_dir={root}/index", "index.kind=brute_force",
        f"retro.embedder_checkpoint={vocabulary}/bert/bert", "retro.chunk_length=8", "retro.continuation_length=8",
        "retro.sequence_length=32", "retro.num_neighbours=2", "retro.decoder_layers=2", "retro.decoder_width=16",
        "retro.decoder_heads=2", "retro.decoder_intermediate=32",
        "retro.dropout_rate=0.0", "retro.validation_fraction=0.2", "retro.test_fraction=0.1", "data.batch_size=2",
        "data.shuffle_buffer=8", "retro_trainer.steps=3", "retro_trainer.warmup_steps=0",
        "retro_trainer.summary_every_steps=1", "retro_trainer.checkpoint_every_steps=3"]
    build_chunk_database.JOB.call(config=TINY, overrides=sets)
    return str(root), sets


@pytest.fixture(scope="session")
def trained(tmp_path_factory, retro_sets):
    """A baseline decoder trained 3 steps, then RETRO-fitted 3 steps (``<root>/baseline``, ``<root>/fit``)."""
    _built_once(tmp_path_factory, "trained", lambda _: _train(*retro_sets))
    return retro_sets


def _train(root, sets):
    from realm_tf import config  # pylint: disable=import-outside-toplevel
    from realm_tf.core import experiment  # pylint: disable=import-outside-toplevel
    from realm_tf.retro import retro_lm  # pylint: disable=import-outside-toplevel

    base = config.load_config(TINY, sets + [f"retro_trainer.model_dir={root}/baseline"])
    assert experiment.run_experiment(retro_lm.RetroLmTask(base, retrieval=False))["step"] == 3
    fit = config.load_config(TINY, sets + [f"retro_trainer.model_dir={root}/fit",
                                           f"retro.retro_fit_from={root}/baseline"])
    assert experiment.run_experiment(retro_lm.RetroLmTask(fit))["step"] == 3
    return True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
    """With ``REALM_TF_TEST_CPU=<file>``: each test's CPU seconds (this process's and its waited-for children's,
    set-up and teardown included) and wall seconds, appended as JSON lines to ``<file>.<xdist worker>``: which tests
    cost the suite's CPU time, a measure that two cores shared with other work distort less than wall time."""
    path = os.environ.get("REALM_TF_TEST_CPU")
    if not path:
        yield
        return
    import resource
    import time

    def cpu():
        own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime

    (own0, children0), wall0 = cpu(), time.time()
    yield
    (own1, children1), wall1 = cpu(), time.time()
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(f"{path}.{worker}", "a", encoding="utf-8") as f:
        f.write(json.dumps({"test": item.nodeid, "cpu": round(own1 - own0, 2),
                            "children_cpu": round(children1 - children0, 2), "wall": round(wall1 - wall0, 2)}) + "\n")
