"""benchmarks/diff_compiled.py: where a compiled training run differs between
flagos and the native device. On the host runtime nothing may differ: the
graphs inductor lowers, the code it generates and the results are CPU's."""

import os
import sys

import pytest

import flagos_core

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import diff_compiled  # noqa: E402


def test_code_is_compared_without_each_sides_kernel_paths():
    native = "# kernel path: /tmp/a/xy/cxy.py\nkernel = 1\n"
    flagos = "# kernel path: /tmp/b/xy/cxy.py\nkernel = 1\n"
    assert diff_compiled.without_kernel_paths(native) == diff_compiled.without_kernel_paths(flagos)
    assert diff_compiled.without_kernel_paths(native) != diff_compiled.without_kernel_paths("kernel = 2\n")


def test_a_difference_is_shown_as_a_unified_diff(capsys):
    diff_compiled.show_diffs("graph", ["a\nb\n", "same"], ["a\nc\n", "same"], "cpu", 10)
    out = capsys.readouterr().out
    assert "graph 0: 2 lines differ" in out and "-b" in out and "+c" in out
    assert "graph 1: identical" in out


@pytest.mark.skipif(flagos_core.runtime()["name"] != "host", reason="the GPU check runs it against the GPU")
def test_a_compiled_tiny_qwen3_is_cpus_on_the_host_runtime(tmp_path, capsys, monkeypatch):
    # One thread in each side's process: inductor's CPU code for the
    # embedding's backward adds across threads in whatever order they come
    # (a whole-suite run once saw the two sides' parameters differ).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert diff_compiled.main(["--size", "tiny", "--steps", "1", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "graph: 2 on cpu, 2 on flagos" in out and "code: 2 on cpu, 2 on flagos" in out
    assert out.count(": identical") == 4, out
    assert "parameters after the last step: 24 of 24 bitwise equal" in out
    assert "DIFFERS" not in out
