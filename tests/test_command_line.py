"""The command-line convention (realm_tf/command_line.py), walked over every parser of ``realm-tf`` and of
``python -m beam_jobs.<job>``: kebab-case flags, old spellings hidden and deprecated, unknown flags refused with a
suggestion, Beam options passed through, test hooks hidden, an ``Examples:`` epilog whose lines parse."""
import argparse
import importlib
import shlex

import pytest

import realm_tf
from beam_jobs import job_flags
from realm_tf import cli
from realm_tf import command_line
from realm_tf.commands import experiments

_BEAM_JOB_MODULES = ("build_chunk_database", "build_knn_datastore", "embed_blocks", "generate_ict_data",
                     "generate_pretraining_data", "preprocess_corpus", "update_corpus")


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices  # noqa: SLF001


def _beam_job_parsers() -> dict[str, argparse.ArgumentParser]:
    found = {}
    for name in _BEAM_JOB_MODULES:
        module = importlib.import_module(f"beam_jobs.{name}")
        jobs = [v for v in vars(module).values() if isinstance(v, type) and getattr(v, "name", "") == name]
        assert len(jobs) == 1, name
        found[name] = jobs[0]().parser()
    return found


def _all_parsers() -> dict[str, argparse.ArgumentParser]:
    return {**_subparsers(), **{f"beam_jobs.{k}": v for k, v in _beam_job_parsers().items()}}


def test_every_shown_flag_is_kebab_case_and_every_old_spelling_is_hidden_and_accepted():
    for name, parser in _all_parsers().items():
        assert isinstance(parser, command_line.ConventionParser), name
        shown = parser.format_help()
        for action in parser._actions:  # noqa: SLF001
            for flag in action.option_strings:
                if flag in parser.deprecated:
                    assert parser.deprecated[flag] in action.option_strings, (name, flag)
                    assert f"{flag} " not in shown and f"{flag}\n" not in shown, (name, flag)
                else:
                    assert "_" not in flag, (name, flag)


def test_test_hooks_are_hidden_but_work():
    parsers = _all_parsers()
    for name in ("embed-blocks", "update-corpus", "refresh-index", "beam_jobs.embed_blocks"):
        assert "pause-before-commit" not in parsers[name].format_help(), name
    args, _ = parsers["beam_jobs.embed_blocks"].parse_known_args(["--pause-before-commit", "2"])
    assert args.pause_before_commit == 2.0


def test_every_command_has_examples_that_parse():
    parser = cli.build_parser()
    for command in cli.COMMANDS:
        assert command.examples, command.name
        assert "Examples:" in _subparsers()[command.name].format_help(), command.name
        for example in command.examples:
            argv = shlex.split(example)
            assert argv[:2] == ["realm-tf", command.name], example
            try:  # refuses an unknown flag or a missing required one
                resolved = experiments.resolve(argv[1:])  # evaluate --experiment NAME: NAME's own evaluation
                args = parser.parse_args(resolved)
            except SystemExit as e:
                raise AssertionError(f"the example does not parse: {example}") from e
            assert args.command == resolved[0]


def test_every_beam_job_has_examples_that_parse_and_a_version(capsys):
    for name, parser in _beam_job_parsers().items():
        examples = job_flags.EXAMPLES[name]
        assert examples and "Examples:" in parser.format_help(), name
        for example in examples:
            argv = shlex.split(f"python -m beam_jobs.{name} {example}")
            assert argv[:3] == ["python", "-m", f"beam_jobs.{name}"], example
            assert f"  python -m beam_jobs.{name} {example}" in parser.format_help(), example
            try:  # refuses an unknown flag or a missing required one
                parser.parse_known_args(argv[3:])
            except SystemExit as e:
                raise AssertionError(f"the example does not parse: {example}") from e
        with pytest.raises(SystemExit) as stopped:
            parser.parse_known_args(["--version"])
        assert stopped.value.code == 0 and f"realm-tf {realm_tf.__version__}" in capsys.readouterr().out, name
    assert set(job_flags.EXAMPLES) == set(_BEAM_JOB_MODULES)


def test_the_command_list_is_grouped_and_fits_100_columns(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 100
    headings = [line.strip() for line in text.splitlines()
                if line.startswith("  ") and not line.startswith("   ") and line.endswith(":")]
    assert headings == [f"{h}:" for h in cli.command.GROUPS.values()]


def test_version(capsys):
    with pytest.raises(SystemExit) as stopped:
        cli.main(["--version"])
    assert stopped.value.code == 0 and capsys.readouterr().out.strip() == f"realm-tf {realm_tf.__version__}"


def test_an_unknown_flag_is_refused_with_the_nearest_known_one(capsys):
    for argv in (["embed-blocks", "--config", "configs/tiny.yaml", "--index-dri", "x"],
                 ["pretrain", "--config", "configs/tiny.yaml", "--eval_onyl"]):
        with pytest.raises(SystemExit) as stopped:
            cli.main(argv)
        assert stopped.value.code == 2
        wanted = {"embed-blocks": "--index-dir", "pretrain": "--eval-only"}[argv[0]]
        assert f"did you mean {wanted}?" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:  # a prefix is not a guess
        _beam_job_parsers()["embed_blocks"].parse_known_args(["--index", "x"])
    assert stopped.value.code == 2


def test_an_old_spelling_works_with_a_deprecation_line(capsys):
    parser = _beam_job_parsers()["embed_blocks"]
    args, beam = parser.parse_known_args(["--index_dir", "a", "--num-shards", "3"])
    assert (args.index_dir, args.num_shards, beam) == ("a", 3, [])
    assert "--index_dir is deprecated and will be removed; use --index-dir" in capsys.readouterr().err


def test_beam_options_pass_through_after_the_separator_and_as_beam_declares_them():
    job = _beam_job_parsers()["preprocess_corpus"]
    args, beam = job.parse_known_args(["--input", "a", "--output", "b", "--direct_num_workers=2", "--",
                                       "--runner=DataflowRunner", "--anything-after=1"])
    assert args.output == "b"
    assert beam == ["--direct_num_workers=2", "--runner=DataflowRunner", "--anything-after=1"]
    sub = cli.build_parser().parse_args(["preprocess", "--input", "a", "--output", "b", "--",
                                         "--runner=DirectRunner"])
    assert sub.beam_args == ["--runner=DirectRunner"]


def test_a_renamed_flag_keeps_its_old_name_hidden_and_deprecated(capsys):
    parser = _subparsers()["init-retriever"]
    args, _ = parser.parse_known_args(["--config", "c.yaml", "--out", "runs/r", "--blocks", "9"])
    assert (args.out, args.blocks) == ("runs/r", 9)
    err = capsys.readouterr().err
    assert "--out is deprecated and will be removed; use --output" in err and "use --num-blocks" in err
    assert "--output" in parser.format_help() and "--out " not in parser.format_help()
