"""Third-party plugins by entry point: plugins/flagos_example, built and
installed out of tree against the installed core, and plugins the core must
refuse without crashing.

The module installs flagos-example once (pip, into this interpreter's
environment) and uninstalls it at the end. Discovery runs when flagos_core is
imported, so every check runs in a fresh interpreter.
"""

import json
import os
import re
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest
import torch

import flagos_core
from flagos_core import _C

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "plugins" / "flagos_example"
VERSION = re.search(r'__version__ = "(.+)"', (EXAMPLE / "flagos_example" / "__init__.py").read_text()).group(1)
ABI = _C.PLUGIN_ABI_VERSION

# The refused plugins' facts.
WRONG_NAME, WRONG_VERSION, WRONG_ABI, WRONG_TORCH = "flagos-wrong-abi", "9.1.0", ABI + 1, "2.0.0+elsewhere"
BROKEN_ENTRY, BROKEN_VERSION = "broken", "0.0.1"
BROKEN_ERROR = "libflagos_broken.so: cannot open shared object file: No such file or directory"


def pip(*args, **env):
    scripts = sysconfig.get_path("scripts")  # cmake and ninja of this environment
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        env={**os.environ, "PATH": scripts + os.pathsep + os.environ.get("PATH", ""), **env},
        capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module", autouse=True)
def example_installed(tmp_path_factory):
    """flagos-example built against the installed core, for this module only."""
    build_dir = tmp_path_factory.mktemp("example-build")
    result = pip("install", "--force-reinstall", "--no-build-isolation", "--no-deps", "--no-index",
                 f"--config-settings=build-dir={build_dir}", str(EXAMPLE), TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    if result.returncode != 0:
        pytest.fail(f"building flagos-example failed:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
    yield
    pip("uninstall", "-y", "flagos-example")


FAKE_PLUGIN = """\
\"\"\"A plugin built for another core and torch: the core must refuse it and
never call its other hooks.\"\"\"
import os
import sys

from flagos_core.hookspecs import PluginInfo, hookimpl


def _never():
    sys.stderr.write("the core called a hook of a refused plugin\\n")
    os._exit(3)


@hookimpl
def flagos_plugin_info():
    return PluginInfo({name!r}, {version!r}, abi_version={abi}, torch_version={torch!r})


@hookimpl
def flagos_runtimes():
    _never()


@hookimpl
def flagos_providers():
    _never()


@hookimpl
def flagos_confs():
    _never()


@hookimpl
def flagos_extend_device_module(module, runtime):
    _never()
"""


def _fake_dist(root, dist, version, module, entry, source):
    (root / f"{module}.py").write_text(source)
    info = root / f"{module}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[flagos.plugins]\n{entry} = {module}\n")


@pytest.fixture(scope="module")
def fake_plugins(tmp_path_factory):
    """A folder for PYTHONPATH holding two installed-looking plugins: one
    built for another plugin ABI and torch, one that fails at import."""
    root = tmp_path_factory.mktemp("fake-plugins")
    _fake_dist(root, WRONG_NAME, WRONG_VERSION, "flagos_wrong_abi", "wrong_abi", FAKE_PLUGIN.format(
        name=WRONG_NAME, version=WRONG_VERSION, abi=WRONG_ABI, torch=WRONG_TORCH))
    _fake_dist(root, "flagos-broken", BROKEN_VERSION, "flagos_broken", BROKEN_ENTRY, f"raise ImportError({BROKEN_ERROR!r})\n")
    return root


def run(args, pythonpath=None, **env):
    """A fresh interpreter on the host runtime (results compare with CPU bit
    for bit on any machine), with no other FLAGOS_ settings but `env`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
    clean["FLAGOS_RUNTIME"] = "host"
    if pythonpath:
        clean["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pythonpath), clean.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], cwd=REPO, env={**clean, **env},
                          capture_output=True, text=True, timeout=120)


def run_json(code, pythonpath=None, **env):
    """Runs `code`, which prints one JSON object last; returns it."""
    result = run(["-c", textwrap.dedent(code)], pythonpath, **env)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.splitlines()[-1])


def by_name(plugins):
    return {p["name"]: p for p in plugins}


def test_installed_plugin_is_discovered_and_loaded():
    out = run_json("""
        import json, torch, flagos_core, flagos_example, flagos_example._build_info as b
        print(json.dumps({"plugins": flagos_core.plugins(), "providers": flagos_core.providers(),
                          "runtime": flagos_core.runtime()["name"], "file": flagos_example.__file__,
                          "build": [b.ABI_VERSION, b.TORCH_VERSION],
                          "layers": [flagos_core.route_layer(op) for op in ("add.Tensor", "mul.Tensor", "neg")]}))
        """)
    example = by_name(out["plugins"])["flagos-example"]
    assert example == {"name": "flagos-example", "version": VERSION, "loaded": True, "reason": "", "runtime": None, "problems": []}
    assert {"example_cpp", "example_py"} <= set(out["providers"])
    assert out["runtime"] == "host"
    # the installed copy, built for this core and this torch
    assert not Path(out["file"]).resolve().is_relative_to(EXAMPLE)
    assert out["build"] == [ABI, torch.__version__]
    # installing the plugin routes none of these anywhere
    assert out["layers"] == ["default"] * 3


def test_discovery_switched_off_loads_no_plugin(fake_plugins):
    # What the build's profiling run relies on: with FLAGOS_DISCOVER_PLUGINS=0
    # neither the installed example nor the broken fakes are even imported.
    code = """
        import json, sys, torch, flagos_core
        print(json.dumps({"plugins": flagos_core.plugins(), "providers": flagos_core.providers(),
                          "imported": sorted(m for m in sys.modules if m.startswith(("flagos_example", "flagos_broken")))}))
        """
    off = run_json(code, fake_plugins, FLAGOS_DISCOVER_PLUGINS="0")
    assert [p["name"] for p in off["plugins"]] == ["flagos-core"]
    assert not {"example_cpp", "example_py"} & set(off["providers"])
    assert off["imported"] == []
    on = run_json(code, fake_plugins)  # the same process set-up, discovery on
    assert {"flagos-example", WRONG_NAME, BROKEN_ENTRY} <= set(by_name(on["plugins"]))
    assert "flagos_example" in on["imported"]


def test_cpp_provider_serves_what_is_routed_to_it_bitwise_equal_to_cpu():
    out = run_json("""
        import json, torch, flagos_core

        def bits(t):
            return t.contiguous().reshape(-1).view(torch.uint8)

        torch.manual_seed(0)
        a, b = torch.randn(5, 8), torch.randn(8)
        i, h = torch.randint(-9, 9, (5, 8)), torch.randn(5, 8).half()
        cases = {
            "add": lambda a, b, i, h: a + b,
            "add alpha": lambda a, b, i, h: torch.add(a, b, alpha=-2.5),
            "add int float": lambda a, b, i, h: i + b,
            "add int": lambda a, b, i, h: i + i,
            "add half": lambda a, b, i, h: h + h,
            "add transposed": lambda a, b, i, h: a.t() + a.t(),
            "mul": lambda a, b, i, h: a * b,
            "mul python number": lambda a, b, i, h: 3 * a,
            "mul cpu scalar first": lambda a, b, i, h: torch.mul(torch.tensor(0.5), a),
            "mul int": lambda a, b, i, h: i * 7,
        }
        flagos_core.set_route("mul.Tensor", "example_cpp")  # add.Tensor: FLAGOS_OP_add__Tensor
        out = {"layers": [flagos_core.route_layer("add.Tensor"), flagos_core.route_layer("mul.Tensor")],
               "cases": {}}
        on_flagos = [t.to("flagos:1") for t in (a, b, i, h)]
        with flagos_core.trace() as t:
            got = {name: f(*on_flagos) for name, f in cases.items()}
        for name, f in cases.items():
            want = f(a, b, i, h)
            out["cases"][name] = [str(got[name].device), str(got[name].dtype) == str(want.dtype),
                                  got[name].shape == want.shape, torch.equal(bits(got[name].cpu()), bits(want))]
        out["counts"] = {f"{op} {p}": n for (op, p), n in t.counts.items() if p.startswith("example")}
        # mul hands its fresh result over (adoptNative(std::move(out))): the
        # result is the flagos tensor itself, so it resizes like any other;
        # add wraps its result (adoptNative(out)): growing it grows the
        # native storage under it, with the values kept.
        handed, wrapped = on_flagos[0] * on_flagos[0], on_flagos[0] + on_flagos[0]
        handed.resize_(64)
        out["handed over"] = [str(handed.device), list(handed.shape),
                              torch.equal(bits(handed[:40].cpu()), bits((a * a).reshape(-1)))]
        wrapped.resize_(64)
        out["wrapped resize"] = [str(wrapped.device), list(wrapped.shape),
                                 torch.equal(bits(wrapped[:40].cpu()), bits((a + a).reshape(-1)))]
        errors = []
        for f in (lambda: torch.ones(3, device="flagos") + torch.ones(3),
                  lambda: torch.ones(3, device="flagos:0") * torch.ones(3, device="flagos:1")):
            try:
                f()
            except RuntimeError as e:
                errors.append(str(e).splitlines()[0])
        out["errors"] = errors
        print(json.dumps(out))
        """, FLAGOS_OP_add__Tensor="example_cpp", FLAGOS_HOST_DEVICES="2")
    assert out["layers"] == ["env:FLAGOS_OP_add__Tensor", "api"]
    for name, result in out["cases"].items():
        assert result == ["flagos:1", True, True, True], name  # device, dtype, shape, bits
    assert out["counts"] == {"add.Tensor example_cpp": 6, "mul.Tensor example_cpp": 4}
    assert out["handed over"] == ["flagos:1", [64], True]  # resized in place, values kept
    assert out["wrapped resize"] == ["flagos:1", [64], True]
    assert len(out["errors"]) == 2
    assert all("Expected all tensors to be on the same device" in e for e in out["errors"])
    assert "flagos:0 and cpu" in out["errors"][0] and "flagos:0 and flagos:1" in out["errors"][1]


def test_python_provider_and_the_shipped_conf():
    out = run_json("""
        import json, torch, flagos_core

        def error_of(f):
            try:
                f()
            except RuntimeError as e:
                return str(e)

        torch.manual_seed(0)
        a = torch.randn(4, 6)
        x = a.to("flagos")
        flagos_core.set_route("neg", "example_py")  # relu: the plugin's conf
        with flagos_core.trace() as t:
            got = [-x, torch.relu(x), x.t().neg()]
        want = [-a, torch.relu(a), a.t().neg()]
        leaf = x.clone().requires_grad_()
        torch.relu(-leaf).sum().backward()  # autograd runs above the provider
        print(json.dumps({
            "equal": [g.device.type == "flagos" and torch.equal(g.cpu(), w) for g, w in zip(got, want)],
            "counts": {f"{op} {p}": n for (op, p), n in t.counts.items() if p.startswith("example")},
            "grad": torch.equal(leaf.grad.cpu(), -(a < 0).float()),
            "relu": [flagos_core.route("relu"), flagos_core.route_layer("relu")],
            "sub_error": error_of(lambda: flagos_core.set_route("sub.Tensor", "example_py")),
        }))
        """)
    assert out["equal"] == [True, True, True]
    assert out["counts"] == {"neg example_py": 2, "relu example_py": 1}
    assert out["grad"]
    provider, layer = out["relu"]
    assert provider == "example_py"
    assert re.fullmatch(r"plugin:flagos-example:.*/flagos_example/confs/example\.yaml:\d+", layer)
    assert out["sub_error"] == "flagos: provider 'example_py' has no kernel for sub.Tensor"


def test_user_layers_override_the_plugin_conf():
    out = run_json("""
        import json, flagos_core
        print(json.dumps([flagos_core.route("relu"), flagos_core.route_layer("relu")]))
        """, FLAGOS_OP_relu="host")
    assert out == ["host", "env:FLAGOS_OP_relu"]


def test_stale_build_of_the_example_is_refused_before_its_code_loads():
    """The real plugin.py, with build facts of another core: refused, and
    its compiled module never imported."""
    out = run_json("""
        import importlib.abc, importlib.machinery, json, sys

        class StaleBuildInfo(importlib.abc.MetaPathFinder, importlib.abc.Loader):
            def find_spec(self, name, path, target=None):
                if name == "flagos_example._build_info":
                    return importlib.machinery.ModuleSpec(name, self)
            def create_module(self, spec):
                return None
            def exec_module(self, module):
                module.ABI_VERSION, module.TORCH_VERSION = %d, "1.0.0+stale"

        sys.meta_path.insert(0, StaleBuildInfo())
        import torch, flagos_core
        print(json.dumps({"plugins": flagos_core.plugins(), "providers": flagos_core.providers(),
                          "loaded _C": "flagos_example._C" in sys.modules,
                          "works": (torch.ones(2, device="flagos") * 3).tolist()}))
        """ % (ABI + 1))
    example = by_name(out["plugins"])["flagos-example"]
    assert example["loaded"] is False
    assert f"plugin ABI {ABI + 1} (this core has plugin ABI {ABI})" in example["reason"]
    assert f"torch 1.0.0+stale (this process has torch {torch.__version__})" in example["reason"]
    assert not out["loaded _C"]
    assert "example_cpp" not in out["providers"] and "example_py" not in out["providers"]
    assert out["works"] == [3.0, 3.0]


@pytest.fixture(scope="module")
def with_fakes(fake_plugins):
    """One process with the example and both fake plugins installed."""
    return run_json("""
        import json, torch, flagos_core
        x = torch.arange(4.0, device="flagos")
        print(json.dumps({"plugins": flagos_core.plugins(), "providers": flagos_core.providers(),
                          "runtime": flagos_core.runtime(), "works": (x * 2 + 1).cpu().tolist()}))
        """, pythonpath=fake_plugins)


def test_plugin_built_for_another_abi_and_torch_is_refused(with_fakes):
    wrong = by_name(with_fakes["plugins"])[WRONG_NAME]
    assert wrong["version"] == WRONG_VERSION and wrong["loaded"] is False and wrong["runtime"] is None
    reason = wrong["reason"]
    assert f"plugin ABI {WRONG_ABI}" in reason and f"this core has plugin ABI {ABI}" in reason
    assert f"torch {WRONG_TORCH}" in reason and f"this process has torch {torch.__version__}" in reason
    # the process carries on, on the host runtime, with the good plugin loaded
    assert with_fakes["runtime"]["name"] == "host"
    assert with_fakes["works"] == [1.0, 3.0, 5.0, 7.0]
    assert by_name(with_fakes["plugins"])["flagos-example"]["loaded"] is True
    assert "example_cpp" in with_fakes["providers"]


def test_plugin_failing_at_import_is_refused_with_its_error(with_fakes):
    broken = by_name(with_fakes["plugins"])[BROKEN_ENTRY]
    assert broken["version"] == BROKEN_VERSION and broken["loaded"] is False
    assert broken["reason"] == f"loading it failed: ImportError: {BROKEN_ERROR}"


def test_cli_info_lists_loaded_and_refused_plugins(fake_plugins):
    result = run(["-m", "flagos_core", "info"], pythonpath=fake_plugins)
    assert result.returncode == 0, result.stderr
    rows = {}
    for line in result.stdout.splitlines():
        key, _, value = line.strip().partition("  ")
        rows[key] = value.strip()
    others = [p for p in flagos_core.plugins() if p["name"] != "flagos-example"]  # e.g. flagos-cuda
    assert rows["plugins"] == str(len(others) + 3)
    assert rows["flagos-example"] == f"{VERSION}, loaded"
    assert rows[WRONG_NAME].startswith(f"{WRONG_VERSION}, refused: {WRONG_NAME} {WRONG_VERSION} was built for "
                                       f"plugin ABI {WRONG_ABI} (this core has plugin ABI {ABI})")
    assert f"torch {WRONG_TORCH} (this process has torch {torch.__version__})" in rows[WRONG_NAME]
    assert rows[BROKEN_ENTRY] == f"{BROKEN_VERSION}, refused: loading it failed: ImportError: {BROKEN_ERROR}"
    assert {"example_cpp", "example_py"} <= set(rows["providers"].split(", "))
