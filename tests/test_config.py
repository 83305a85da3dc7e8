"""Config system: strict YAML loading, dotted overrides, params.yaml round trip."""
import dataclasses
import logging
import pathlib

import pytest

from realm_tf import config


def _write(tmp_path: pathlib.Path, text: str) -> str:
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return str(path)


def test_unknown_top_level_key_names_file_line_and_key(tmp_path):
    path = _write(tmp_path, "name: x\npretrain:\n  steps: 3\nmodle:\n  pooling: cls\n")
    with pytest.raises(config.ConfigError) as e:
        config.load_config(path)
    assert f"{path}:4" in str(e.value)
    assert "'modle'" in str(e.value)


def test_unknown_nested_key_names_dotted_key_and_line(tmp_path):
    path = _write(tmp_path, "model:\n  encoder:\n    hidden_size: 32\n    num_layer: 2\n")
    with pytest.raises(config.ConfigError) as e:
        config.load_config(path)
    message = str(e.value)
    assert f"{path}:4" in message and "'model.encoder.num_layer'" in message
    assert "num_layers" in message  # the known keys are listed


def test_wrong_type_rejected(tmp_path):
    path = _write(tmp_path, "pretrain:\n  steps: many\n")
    with pytest.raises(config.ConfigError, match=r"exp.yaml:2: 'pretrain.steps' must be int"):
        config.load_config(path)
    path = _write(tmp_path, "model:\n  share_embedders: 1\n")
    with pytest.raises(config.ConfigError, match="must be bool"):
        config.load_config(path)


def test_yaml_values_override_defaults_and_the_rest_stay(tmp_path):
    path = _write(tmp_path, "model:\n  encoder:\n    hidden_size: 64\npretrain:\n  learning_rate: 1\n"
                            "refresh:\n  beam_options: ['--runner=DirectRunner']\n")
    cfg = config.load_config(path)
    assert cfg.model.encoder.hidden_size == 64
    assert cfg.model.encoder.num_layers == config.EncoderConfig().num_layers
    assert cfg.pretrain.learning_rate == 1.0 and isinstance(cfg.pretrain.learning_rate, float)
    assert cfg.refresh.beam_options == ("--runner=DirectRunner",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.pretrain.steps = 3  # frozen


def test_dotted_overrides_are_typed_and_strict(tmp_path):
    path = _write(tmp_path, "pretrain:\n  steps: 3\n")
    cfg = config.load_config(path, ["pretrain.steps=100", "model.encoder.num_layers=4", "name=abc",
                                    "index.kind=brute_force"])
    assert cfg.pretrain.steps == 100 and cfg.model.encoder.num_layers == 4
    assert cfg.name == "abc" and cfg.index.kind == "brute_force"
    with pytest.raises(config.ConfigError, match="unknown key 'pretrain.stepz'"):
        config.load_config(path, ["pretrain.stepz=1"])
    with pytest.raises(config.ConfigError, match="must be int"):
        config.load_config(path, ["pretrain.steps=1.5"])
    assert config.load_config(path, ["pretrain.learning_rate=1e-4"]).pretrain.learning_rate == 1e-4  # YAML 1.1
    with pytest.raises(config.ConfigError, match="must be float"):
        config.load_config(path, ["pretrain.learning_rate=fast"])
    with pytest.raises(config.ConfigError, match="KEY=VALUE"):
        config.load_config(path, ["pretrain.steps"])


def test_params_yaml_round_trip(tmp_path):
    cfg = config.load_config("configs/minilm.yaml", ["pretrain.steps=7", f"pretrain.model_dir={tmp_path}"])
    written = config.save_params(cfg, cfg.pretrain.model_dir)
    assert written == str(tmp_path / "params.yaml")
    again = config.load_config(written)
    assert again == cfg
    assert config.config_hash(again) == config.config_hash(cfg)
    assert config.config_hash(config.load_config(written, ["pretrain.steps=8"])) != config.config_hash(cfg)


def test_ict_section_has_orqa_defaults_and_is_separate_from_pretrain():
    cfg = config.load_config(None, ["ict.steps=5"])
    assert cfg.ict.learning_rate == 1e-4 and cfg.pretrain.learning_rate == 3e-5
    assert cfg.ict.steps == 5 and cfg.pretrain.steps == config.TrainerConfig().steps
    assert cfg.ict.model_dir != cfg.pretrain.model_dir


@pytest.mark.parametrize("name", ["tiny", "minilm", "base"])
def test_shipped_configs_load(name):
    cfg = config.load_config(f"configs/{name}.yaml")
    assert cfg.name == name
    assert cfg.model.encoder.hidden_size % cfg.model.encoder.num_attention_heads == 0


def test_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read config"):
        config.load_config(str(tmp_path / "nope.yaml"))


@pytest.mark.parametrize("key,bad", [("model.encoder.hidden_act", "swish"), ("model.pooling", "max"),
                                     ("model.projection_init", "svd"), ("data.salient_span_annotator", "ner"),
                                     ("index.kind", "faiss"), ("refresh.mode", "cron"), ("pretrain.strategy", "gpu"),
                                     ("finetune.strategy", "gpu")])
def test_enumerated_setting_outside_its_choices_names_line_and_allowed_values(tmp_path, key, bad):
    *sections, leaf = key.split(".")
    text = "".join(f"{'  ' * i}{s}:\n" for i, s in enumerate(sections)) + f"{'  ' * len(sections)}{leaf}: {bad}\n"
    path = _write(tmp_path, "name: x\n" + text)
    with pytest.raises(config.ConfigError) as e:
        config.load_config(path)
    message = str(e.value)
    assert f"{path}:{len(sections) + 2}" in message and f"'{key}'" in message and repr(bad) in message
    # every allowed value is listed, and each of them loads
    field_type = config.ExperimentConfig
    for part in key.split("."):
        field_type = {f.name: f for f in dataclasses.fields(field_type)}[part].type
        field_type = getattr(config, field_type) if isinstance(field_type, str) and hasattr(config, field_type) \
            else field_type
    allowed = config.choices(field_type)
    assert len(allowed) >= 2 and all(a in message for a in allowed)
    static = ["data.static_padding=true", "model.reader_length_buckets=1", "model.candidate_length_buckets=1"]
    for value in allowed:  # a TPU needs static shapes (test_distribution)
        loaded = config.load_config(None, [f"{key}={value}", *(static if value == "tpu" else [])])
        node = loaded
        for part in key.split("."):
            node = getattr(node, part)
        assert node == value
    with pytest.raises(config.ConfigError, match="must be one of"):
        config.load_config(None, [f"{key}={bad}"])


def test_the_modules_acting_on_a_choice_know_exactly_its_values():
    from realm_tf.core import distribution
    from realm_tf.data import span_annotators
    from realm_tf.index import index_kinds
    from realm_tf.tasks import projection_init

    assert set(index_kinds.INDEX_KINDS) == set(config.choices(config.IndexKind))
    assert set(distribution.STRATEGIES) == set(config.choices(config.Strategy))
    assert set(span_annotators.ANNOTATORS) == set(config.choices(config.SpanAnnotator))
    assert set(projection_init.KINDS) == set(config.choices(config.ProjectionInit))


def test_block_length_cut_longer_than_the_retriever_reads_is_rejected(tmp_path):
    path = _write(tmp_path, "model:\n  block_seq_length: 128\ndata:\n  max_block_length: 200\n")
    with pytest.raises(config.ConfigError) as e:
        config.load_config(path)
    assert f"{path}:4" in str(e.value) and "data.max_block_length=200" in str(e.value)
    assert f"{path}:2" in str(e.value)  # where the other side is set
    assert config.load_config(path, ["data.max_block_length=128"]).data.max_block_length == 128


@pytest.mark.parametrize("key", ["model.query_seq_length", "model.block_seq_length", "model.reader_seq_length",
                                 "qa.question_seq_length"])
def test_sequences_longer_than_the_position_embeddings_are_rejected(key):
    sets = ["model.encoder.max_position_embeddings=64", "model.query_seq_length=64", "model.block_seq_length=64",
            "model.reader_seq_length=64", "qa.question_seq_length=64", "data.max_block_length=64",
            "retro.chunk_length=32"]
    assert config.load_config(None, sets).model.encoder.max_position_embeddings == 64
    with pytest.raises(config.ConfigError, match=f"{key}=65 exceeds model.encoder.max_position_embeddings=64"):
        config.load_config(None, sets + [f"{key}=65"])


def test_fewer_than_two_candidates_is_rejected_at_load_naming_the_line(tmp_path):
    path = _write(tmp_path, "data:\n  batch_size: 2\nmodel:\n  num_candidates: 1\n")
    with pytest.raises(config.ConfigError, match=rf"{path}:4: model.num_candidates must be >= 2 .* got 1"):
        config.load_config(path)
    with pytest.raises(config.ConfigError, match="model.num_candidates must be >= 2"):
        config.load_config(None, ["model.num_candidates=0"])
    assert config.load_config(path, ["model.num_candidates=2"]).model.num_candidates == 2


def test_retro_chunks_must_fit_the_key_bert_and_tile_the_sequence():
    with pytest.raises(config.ConfigError, match=r"retro.chunk_length=63 \+ \[CLS\] and \[SEP\] exceeds"):
        config.load_config(None, ["model.encoder.max_position_embeddings=64", "model.query_seq_length=64",
                                  "model.block_seq_length=64", "model.reader_seq_length=64", "data.max_block_length=64",
                                  "qa.question_seq_length=64", "retro.chunk_length=63", "retro.sequence_length=126"])
    with pytest.raises(config.ConfigError, match="not a multiple of retro.chunk_length=64"):
        config.load_config(None, ["retro.sequence_length=100"])


def test_the_older_section_name_trainer_is_read_as_pretrain_with_a_deprecation_message(tmp_path, caplog):
    new = config.load_config(_write(tmp_path, "pretrain:\n  steps: 3\n"), ["pretrain.learning_rate=0.5"])
    with caplog.at_level(logging.WARNING, logger="realm_tf.config"):
        old = config.load_config(_write(tmp_path, "name: x\ntrainer:\n  steps: 3\n"), ["trainer.learning_rate=0.5"])
    assert dataclasses.replace(old, name=new.name) == new
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"{tmp_path / 'exp.yaml'}:2: section 'trainer' is now 'pretrain'" in m for m in messages), messages
    assert any("override 'trainer.learning_rate=0.5': section 'trainer' is now 'pretrain'" in m for m in messages)
    # errors name the new key
    with pytest.raises(config.ConfigError, match=r"exp.yaml:3: unknown key 'pretrain.stepz'"):
        config.load_config(_write(tmp_path, "name: x\ntrainer:\n  stepz: 3\n"))
    with pytest.raises(config.ConfigError, match=r"exp.yaml:1: sections 'trainer' and 'pretrain' \(line 3\)"):
        config.load_config(_write(tmp_path, "trainer:\n  steps: 3\npretrain:\n  steps: 4\n"))


def test_config_files_layer_in_order_and_errors_name_the_file_that_set_the_key(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text("model:\n  encoder:\n    num_layers: 3\n    hidden_size: 64\npretrain:\n  steps: 10\n"
                    "  learning_rate: 0.5\n")
    paths = tmp_path / "paths.yaml"
    paths.write_text("pretrain:\n  steps: 20\n  model_dir: /runs/mine\nmodel:\n  encoder:\n    num_layers: 2\n")
    cfg = config.load_config([base, paths], ["pretrain.steps=30"])
    assert (cfg.model.encoder.num_layers, cfg.model.encoder.hidden_size) == (2, 64)  # merged key by key
    assert (cfg.pretrain.steps, cfg.pretrain.learning_rate, cfg.pretrain.model_dir) == (30, 0.5, "/runs/mine")
    assert config.load_config([paths, base]).pretrain.steps == 10  # the later file wins
    bad = tmp_path / "bad.yaml"
    bad.write_text("pretrain:\n  steps: 5\n  nope: 1\n")
    with pytest.raises(config.ConfigError, match=f"{bad}:3"):
        config.load_config([base, bad])


def _output_dirs(cfg: config.ExperimentConfig) -> dict[str, str]:
    """Every ``*_dir`` setting of ``cfg`` (what the jobs write and read back), by dotted key."""
    found = {}
    for section in dataclasses.fields(cfg):
        value = getattr(cfg, section.name)
        if dataclasses.is_dataclass(value):
            found.update({f"{section.name}.{f.name}": getattr(value, f.name) for f in dataclasses.fields(value)
                          if f.name.endswith("_dir")})
    return found


@pytest.mark.parametrize("name", ["tiny", "minilm", "base"])
def test_a_shipped_config_writes_every_job_under_its_own_root_and_no_two_into_one_place(name):
    """No job of a shipped config falls back to the built-in defaults' root (``/tmp/realm_tf``), which another
    config's run would share, and no two settings name one directory (ICT's records and its checkpoints)."""
    cfg = config.load_config(f"configs/{name}.yaml")
    dirs = _output_dirs(cfg)
    assert len(dirs) >= 12 and {"reader.model_dir", "retro.knn_dir", "retro_trainer.model_dir"} <= set(dirs)
    roots = {key: value.rsplit("/", 2)[0] if key.startswith("retro.") else value.rsplit("/", 1)[0]
             for key, value in dirs.items()}
    assert len(set(roots.values())) == 1, roots
    assert not set(roots.values()) & {config.DataConfig().blocks_dir.rsplit("/", 1)[0]}, roots
    assert len(set(dirs.values())) == len(dirs), dirs


def test_base_gives_every_training_job_a_batch_and_a_strategy():
    cfg = config.load_config("configs/base.yaml")
    for section in ("pretrain", "ict", "reader", "finetune", "retro_trainer"):
        trainer = getattr(cfg, section)
        assert trainer.batch_size > 0 and trainer.strategy != "default", section
        assert trainer.batch_size % trainer.gradient_accumulation_steps == 0, section
