"""IndexRefresher: indexes each new export (skipping to the newest when behind); a failing export is recorded
where the trainer reads it and retried up to refresh.max_failures attempts, and the index in service is kept."""
import dataclasses
import gzip
import itertools
import os
import shutil

import pytest

from beam_jobs import embed_blocks
from beam_jobs import preprocess_corpus
from realm_tf import config
from realm_tf.export import retriever_export
from realm_tf.index import index_publisher
from realm_tf.index import index_refresher
from realm_tf.index import refresh_failures
from realm_tf.index import refresh_supervisor
from realm_tf.models import knowledge_retriever

TINY = "configs/tiny.yaml"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """20 bundled passages preprocessed once, and one retriever that every test exports (so its export's signatures
    are traced once, as in a trainer)."""
    root = tmp_path_factory.mktemp("refresher_corpus")
    with gzip.open("data/open_qa/passages.jsonl.gz", "rt") as f:
        (root / "corpus.jsonl").write_text("".join(itertools.islice(f, 20)))
    preprocess_corpus.JOB.call(config=TINY, overrides=[f"data.blocks_dir={root}/blocks"],
                               input=[str(root / "corpus.jsonl")], output=str(root / "blocks"))
    return root / "blocks", knowledge_retriever.build_knowledge_retriever(config.load_config(TINY).model)


@pytest.fixture()
def setup(tmp_path, corpus):
    blocks, model = corpus
    shutil.copytree(blocks, tmp_path / "blocks")  # each test's own corpus directory
    overrides = [f"data.blocks_dir={tmp_path}/blocks", f"index.index_dir={tmp_path}/index",
                 f"refresh.export_dir={tmp_path}/export", "refresh.keep_exports=10"]
    cfg = config.load_config(TINY, overrides)
    params = config.save_params(cfg, str(tmp_path))
    return cfg, params, model


def test_indexes_new_exports_and_skips_to_the_newest(setup):
    cfg, params, model = setup
    refresher = index_refresher.IndexRefresher(params, embed_blocks.embed_and_publish)
    assert refresher.pending_export() is None and refresher.refresh_once() is None  # nothing exported yet
    retriever_export.export_retriever(model, cfg, 3)
    assert refresher.refresh_once() == 3
    assert index_publisher.complete_versions(cfg.index.index_dir) == [3]
    assert refresher.refresh_once() is None  # up to date
    retriever_export.export_retriever(model, cfg, 5)
    retriever_export.export_retriever(model, cfg, 9)
    assert refresher.refresh_once() == 9  # behind: the newest export only
    assert index_publisher.complete_versions(cfg.index.index_dir) == [3, 9]
    meta = index_publisher.read_index_json(index_publisher.version_dir(cfg.index.index_dir, 9))
    assert meta["export_path"].endswith("/9") and meta["exported_at"] > 0


def test_a_failing_export_is_recorded_for_the_trainer_retried_then_given_up(setup):
    cfg, params, model = setup
    refresher = index_refresher.IndexRefresher(params, embed_blocks.embed_and_publish)
    retriever_export.export_retriever(model, cfg, 2)
    assert refresher.refresh_once() == 2
    broken = retriever_export.export_retriever(model, cfg, 4)
    os.remove(os.path.join(broken, "saved_model.pb"))  # export.json says complete, but the model is gone
    export_dir, index_dir = cfg.refresh.export_dir, cfg.index.index_dir
    assert refresher.refresh_once() is None
    first = refresh_failures.read(export_dir, 4)
    assert first["attempts"] == 1 and "saved_model" in first["error"].lower()
    assert refresh_failures.since_last_index(export_dir, index_dir) == (1, first["error"])
    assert refresher.pending_export() == 4  # retried, up to refresh.max_failures attempts
    assert refresher.refresh_once() is None and refresher.refresh_once() is None
    assert 4 in refresher.failed and refresher.pending_export() is None  # then given up
    assert refresh_failures.since_last_index(export_dir, index_dir)[0] == cfg.refresh.max_failures == 3
    assert index_publisher.complete_versions(index_dir) == [2]  # the old version stays in service
    assert os.listdir(os.path.join(export_dir, refresh_failures.DIRECTORY)) == ["4.json"]  # no staging file left
    retriever_export.export_retriever(model, cfg, 6)
    assert refresher.refresh_once() == 6
    assert refresh_failures.since_last_index(export_dir, index_dir) == (0, None)  # counted since the newest index


def test_exports_backing_index_versions_are_not_pruned(setup):
    cfg, params, model = setup
    cfg = config.load_config(params, ["refresh.keep_exports=1"])
    retriever_export.export_retriever(model, cfg, 1)
    index_refresher.IndexRefresher(params, embed_blocks.embed_and_publish).refresh_once()
    for step in (2, 3):
        retriever_export.export_retriever(model, cfg, step)
    # Export 1 backs index version 1, which the trainer may still search; 2 and 3 are newer than every
    # published version, so an index builder may be embedding them: all kept.
    assert retriever_export.list_exports(cfg.refresh.export_dir) == [1, 2, 3]
    refresher = index_refresher.IndexRefresher(params, embed_blocks.embed_and_publish)
    assert refresher.refresh_once() == 3  # the builder skips to the newest
    retriever_export.export_retriever(model, cfg, 4)
    # 2 is older than the newest published version: no builder will use it; 1 and 3 back index versions.
    assert retriever_export.list_exports(cfg.refresh.export_dir) == [1, 3, 4]


def test_the_supervisor_without_a_builder_builds_the_first_index_in_a_child_process(setup):
    cfg, params, model = setup
    supervisor = refresh_supervisor.RefreshSupervisor(cfg, params)  # no builder: `realm-tf refresh-index` runs it
    supervisor.bootstrap(0, lambda: retriever_export.export_retriever(model, cfg, 0))
    assert index_publisher.complete_versions(cfg.index.index_dir) == [0]
    supervisor.bootstrap(0, lambda: pytest.fail("an index exists: nothing is exported"))


def test_the_supervisor_refuses_thread_mode_without_a_builder(setup):
    cfg, params, _ = setup
    threaded = dataclasses.replace(cfg, refresh=dataclasses.replace(cfg.refresh, mode="thread",
                                                                    export_every_steps=1))
    with pytest.raises(config.ConfigError, match="refresh.mode=thread"):
        refresh_supervisor.RefreshSupervisor(threaded, params).start()
    supervisor = refresh_supervisor.RefreshSupervisor(threaded, params, embed_blocks.embed_and_publish)
    supervisor.start()
    assert supervisor.refresher is not None and supervisor.refresher.build_index is embed_blocks.embed_and_publish
    supervisor.stop()
