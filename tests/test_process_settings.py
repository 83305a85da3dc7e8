"""The process settings the command line applies before TensorFlow's first tensor (issue #20)."""
import os
import subprocess
import sys

from realm_tf import process_settings


def test_defaults_fill_gaps_and_never_override_the_environment():
    env = {"TF_CPU_ALLOCATOR_USE_BFC": "false", "TF_XLA_FLAGS": "--tf_xla_auto_jit=2", "OTHER": "1"}
    assert process_settings.apply(env) == {"TF_CPU_ALLOCATOR_USE_BFC": "false",  # the user's choices stay
                                           "TF_XLA_FLAGS": "--tf_xla_auto_jit=2"}
    assert env["OTHER"] == "1"
    empty: dict[str, str] = {}
    assert process_settings.apply(empty) == process_settings.DEFAULTS
    assert empty == {"TF_CPU_ALLOCATOR_USE_BFC": "true",
                     "TF_XLA_FLAGS": "--tf_xla_persistent_cache_directory=" + process_settings.XLA_CACHE_DIR}


def test_the_command_line_runs_under_the_settings():
    """``realm-tf`` applies them before a subcommand runs; a child process it starts inherits them."""
    code = ("import os; from realm_tf import cli; "
            "assert 'TF_CPU_ALLOCATOR_USE_BFC' not in os.environ or os.environ['TF_CPU_ALLOCATOR_USE_BFC'] == 'false'; "
            "assert cli.main(['config', '--config', 'configs/tiny.yaml']) == 0; "
            "print('BFC=' + os.environ['TF_CPU_ALLOCATOR_USE_BFC'])")
    env = {k: v for k, v in os.environ.items() if k != "TF_CPU_ALLOCATOR_USE_BFC"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert "BFC=true" in out.stdout
    out = subprocess.run([sys.executable, "-c", code], env={**env, "TF_CPU_ALLOCATOR_USE_BFC": "false"},
                         capture_output=True, text=True, check=True)
    assert "BFC=false" in out.stdout


def test_compiled_programs_are_kept_on_disk_for_the_next_process(tmp_path):
    """With the XLA cache flag, the first process compiles BERT's inference program and stores it; the second
    finds it there and stores nothing new."""
    code = ("import os; os.environ.setdefault('TF_USE_LEGACY_KERAS', '1'); import tensorflow as tf; "
            "from realm_tf import config; from realm_tf.networks import bert_encoder, length_buckets; "
            "enc = bert_encoder.build_bert_encoder(config.load_config('configs/tiny.yaml').model.encoder); "
            "ids = tf.constant([[101, 7, 8, 102, 0]] * 2); "
            "x = {'input_word_ids': ids, 'input_mask': tf.cast(ids > 0, tf.int32), 'input_type_ids': 0 * ids}; "
            "print(length_buckets.compiled_forward(enc)(x)['pooled_output'].shape)")
    cache = tmp_path / "xla"
    env = {**os.environ, "TF_XLA_FLAGS": f"--tf_xla_persistent_cache_directory={cache}"}
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    first = {p.name: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert first  # the compiled program
    subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert {p.name: p.stat().st_mtime_ns for p in cache.iterdir()} == first  # read, neither added nor rewritten


def test_native_bfloat16_reads_the_cpu_flags(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16 fma\n\nprocessor\t: 1\n")
    assert process_settings.native_bfloat16(str(path))
    path.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f fma\n")
    assert not process_settings.native_bfloat16(str(path))
    path.write_text("processor\t: 0\nflags\t\t: fpu amx_bf16 amx_tile\n")
    assert process_settings.native_bfloat16(str(path))
    assert not process_settings.native_bfloat16(str(tmp_path / "missing"))


def test_the_compiled_program_cache_keeps_the_most_recently_used_under_its_bound(tmp_path):
    (tmp_path / "sub").mkdir()
    sizes = {"a": 400, "b": 300, "sub/c": 200, "d": 100}  # a is the least recently used, d the most
    for age, (name, size) in enumerate(sizes.items()):
        (tmp_path / name).write_bytes(b"x" * size)
        os.utime(tmp_path / name, (1_000_000 + age, 1_000_000 + age))
    assert process_settings.bound_cache(str(tmp_path), 1000) == []  # 1,000 bytes: already within
    removed = process_settings.bound_cache(str(tmp_path), 350)  # keep 200 + 100: the two most recent
    assert sorted(os.path.relpath(p, tmp_path) for p in removed) == ["a", "b"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == ["d", "sub/c"]
    assert process_settings.bound_cache(str(tmp_path / "missing"), 0) == []
