"""python -m flagos_core info | routes | ops | trace, each in a fresh process."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

import flagos_core
from flagos_core import _C

REPO = Path(__file__).resolve().parents[1]
# The active runtime's own provider (host, cuda, ...): its kernels on native aliases.
NATIVE = flagos_core.runtime()["name"]

SCRIPT = """\
import sys, torch
n = int(sys.argv[1])
x = torch.arange(float(n), device="flagos")
y = x * 2 + x
print("script says", y.cpu().tolist())
if len(sys.argv) > 2:
    sys.exit(int(sys.argv[2]))
"""


def cli(*args, **env):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
    return subprocess.run(
        [sys.executable, "-m", "flagos_core", *args], cwd=REPO, env={**clean, **env},
        capture_output=True, text=True, timeout=120)


def rows(stdout):
    return [line.split() for line in stdout.splitlines()]


def test_info():
    result = cli("info")
    assert result.returncode == 0, result.stderr
    info = {row[0]: row[1:] for row in rows(result.stdout)}
    assert info["torch"] == [torch.__version__]
    assert info["runtime"][0] == flagos_core.runtime()["name"]
    plugins = flagos_core.plugins()
    assert info["plugins"] == [str(len(plugins) or "none")]
    for plugin in plugins:
        assert info[plugin["name"]][0] == plugin["version"] + ","
        assert ("loaded" if plugin["loaded"] else "refused:") in info[plugin["name"]][1]
    assert " ".join(info["providers"]) == ", ".join(flagos_core.providers())
    assert info["devices"] == [str(torch.flagos.device_count())]
    assert " ".join(info["flagos:0"]) == torch.flagos.get_device_name(0)


def test_routes_filters_by_pattern_and_shows_the_layer():
    result = cli("routes", "add*", FLAGOS_OP_add__Tensor="cpu_fallback")
    assert result.returncode == 0, result.stderr
    table = rows(result.stdout)
    assert table[0] == ["overload", "provider", "layer"]
    by_name = {row[0]: row[1:] for row in table[1:]}
    assert by_name["add.Tensor"] == ["cpu_fallback", "env:FLAGOS_OP_add__Tensor"]
    assert by_name["add.out"] == [flagos_core.route("add.out"), "default"]
    assert sorted(by_name) == sorted(n for n in _C._slot_names() if n.startswith("add"))
    # columns line up: every row puts the provider where the header does
    header = result.stdout.splitlines()[0]
    assert all(line[header.index("provider"):].split()[0] in ("cpu_fallback", NATIVE)
               for line in result.stdout.splitlines()[1:])


def test_routes_without_match_is_a_one_line_error():
    result = cli("routes", "no_such_op*")
    assert result.returncode == 2
    assert result.stderr == "flagos: error: no overload matches 'no_such_op*'\n"


def test_ops_counts_what_each_provider_can_serve():
    result = cli("ops")
    assert result.returncode == 0, result.stderr
    names = _C._slot_names()
    counts = {row[0]: int(row[1]) for row in rows(result.stdout)[1:] if len(row) == 2 and row[1].isdigit()}
    assert counts == {p: sum(_C._can_serve(n, p) for n in names) for p in flagos_core.providers()}
    assert f"of {len(names)} routable overloads" in result.stdout
    only_fallback = [n for n in names if _C._can_serve(n, "cpu_fallback")
                     and not any(_C._can_serve(n, p) for p in flagos_core.providers() if p != "cpu_fallback")]
    assert f"overloads only cpu_fallback serves (host round trip): {len(only_fallback) or 'none'}" in result.stdout


def test_trace_prints_tables_and_fallbacks(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = cli("trace", "--", str(script), "4", FLAGOS_OP_mul__Tensor="cpu_fallback")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "script says [0.0, 3.0, 6.0, 9.0]" in out
    assert "calls per provider" in out and "calls per overload" in out
    table = rows(out)
    assert ["mul.Tensor", "cpu_fallback", "1"] in table
    assert ["add.Tensor", NATIVE, "1"] in table
    assert "through cpu_fallback (copied to the host and back): 1" in out
    assert out.rstrip().splitlines()[-1].split() == ["mul.Tensor", "1"]


def test_trace_json_passes_args_and_exit_code(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    result = cli("trace", "--json", "--", str(script), "3", "7", FLAGOS_OP_mul__Tensor="cpu_fallback")
    assert result.returncode == 7
    assert "script says [0.0, 3.0, 6.0]" in result.stderr  # stdout holds only the JSON
    report = json.loads(result.stdout)
    assert report["script"] == str(script)
    assert report["args"] == ["3", "7"]
    assert report["exit_code"] == 7
    calls = {(c["overload"], c["provider"]): c["calls"] for c in report["calls"]}
    assert calls[("mul.Tensor", "cpu_fallback")] == 1
    assert calls[("add.Tensor", NATIVE)] == 1
    assert report["fallbacks"] == ["mul.Tensor"]
    assert report["providers"]["cpu_fallback"] == 1
    assert sum(report["providers"].values()) == sum(calls.values())


def test_trace_reports_a_scripts_own_exit_and_failure_as_python_would(tmp_path):
    # sys.exit() is 0 and sys.exit("message") prints it and is 1, in the
    # report as in the exit status; a ConfError the script raises is the
    # script's failure (its traceback, 1), not the command line's (2).
    for code, exit_code, printed in (("sys.exit()", 0, ""), ("sys.exit('bye bye')", 1, "bye bye\n")):
        script = tmp_path / "exits.py"
        script.write_text(f"import sys\n{code}\n")
        result = cli("trace", "--json", "--", str(script))
        assert (result.returncode, json.loads(result.stdout)["exit_code"], result.stderr) == (exit_code, exit_code,
                                                                                             printed)
    script = tmp_path / "conf_fails.py"
    script.write_text(f"import flagos_core\nflagos_core.load_conf({str(tmp_path / 'missing.yaml')!r})\n")
    result = cli("trace", "--", str(script))
    assert result.returncode == 1
    assert "Traceback" in result.stderr and 'conf_fails.py", line 2' in result.stderr
    assert result.stderr.rstrip().endswith("No such file or directory")


def test_trace_needs_an_existing_script(tmp_path):
    result = cli("trace", "--", str(tmp_path / "missing.py"))
    assert (result.returncode, result.stderr) == (2, f"flagos: error: no such script: {tmp_path / 'missing.py'}\n")
    result = cli("trace")
    assert result.returncode == 2 and result.stderr.startswith("flagos: error: trace needs a script")


def test_conf_errors_are_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("""\
        routes:
          add.Tensor: no_such_provider
        """))
    for command in (["info"], ["routes"], ["ops"], ["trace", "--", "x.py"]):
        result = cli(*command, FLAGOS_CONF=str(bad))
        assert result.returncode == 2, command
        assert result.stdout == ""
        assert result.stderr == (
            f"flagos: error: {bad}:2: unknown provider 'no_such_provider' for add.Tensor; "
            f"valid providers: {', '.join(flagos_core.providers())}\n")


def test_no_command_prints_usage_and_exits_2():
    result = cli()
    assert result.returncode == 2
    assert result.stderr.startswith("usage: python -m flagos_core")
