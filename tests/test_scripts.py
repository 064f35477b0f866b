"""Developer scripts reject bad arguments before building anything."""

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def ab_variants(*args):
    return subprocess.run(["bash", str(REPO / "scripts" / "ab-variants"), *args],
                          capture_output=True, text=True, timeout=60)


def test_ab_variants_without_settings_prints_its_usage():
    run = ab_variants("-", "2")
    assert run.returncode == 2
    assert "bash scripts/ab-variants PATCH PASSES SETTING" in run.stderr
    assert run.stdout == ""


def test_ab_variants_names_a_malformed_setting_and_what_is_valid():
    run = ab_variants("-", "2", "base", "FLAGOS_X=1,not a setting")
    assert run.returncode == 2
    assert "'FLAGOS_X=1,not a setting'" in run.stderr
    assert "'base' nor NAME=VALUE[,NAME=VALUE...]" in run.stderr
    assert run.stdout == ""


def test_ab_variants_checks_the_patch_and_the_passes(tmp_path):
    run = ab_variants(str(tmp_path / "missing.patch"), "2", "base")
    assert run.returncode == 2
    assert "missing.patch' is not a file (give a patch, or - for none)" in run.stderr
    run = ab_variants("-", "two", "base")
    assert run.returncode == 2
    assert "PASSES must be a positive whole number, got 'two'" in run.stderr
