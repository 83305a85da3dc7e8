"""The process settings the command line applies before TensorFlow's first tensor (issue #20)."""
import os
import subprocess
import sys

from realm_tf import process_settings


def test_defaults_fill_gaps_and_never_override_the_environment():
    env = {"TF_CPU_ALLOCATOR_USE_BFC": "false", "OTHER": "1"}
    assert process_settings.apply(env) == {"TF_CPU_ALLOCATOR_USE_BFC": "false"}  # the user's choice stays
    assert env["OTHER"] == "1"
    empty: dict[str, str] = {}
    assert process_settings.apply(empty) == process_settings.DEFAULTS
    assert empty == {"TF_CPU_ALLOCATOR_USE_BFC": "true"}


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
