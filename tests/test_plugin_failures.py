"""A plugin whose runtime or provider fails to set up must not take torch down:
the next runtime is used, the failure is warned about and listed by
flagos_core.plugins(); asking for the broken runtime by name is a clear error."""

import types

import pytest

import flagos_core
from flagos_core import _plugins
from flagos_core.hookspecs import PluginInfo, ProviderSpec, RuntimeSpec, hookimpl


def _fail(message):
    def run():
        raise RuntimeError(message)
    return run


def _broken_plugin(runtime_fails=True, provider_fails=True):
    module = types.ModuleType("flagos_broken_test_plugin")
    module.flagos_plugin_info = hookimpl(lambda: PluginInfo("flagos-broken", "0.0.1"))
    module.flagos_runtimes = hookimpl(lambda: [RuntimeSpec(
        "broken", priority=1000, is_available=lambda: True,
        activate=_fail("no device answers") if runtime_fails else (lambda: None))])
    module.flagos_providers = hookimpl(lambda: [ProviderSpec(
        "broken_kernels", register=_fail("kernel library missing") if provider_fails else (lambda: None))])
    module.flagos_confs = hookimpl(lambda: ["/nonexistent/broken.yaml"])
    return module


@pytest.fixture
def plugins(monkeypatch):
    monkeypatch.delenv("FLAGOS_RUNTIME", raising=False)
    p = _plugins.Plugins()
    p._register(_broken_plugin(), "flagos-broken")
    return p


def test_failed_runtime_falls_back_and_is_reported(plugins):
    current = flagos_core.runtime()["name"]  # already active in this process: activating it again is a no-op
    if current != "host":
        pytest.skip("checks the fallback to the host runtime")
    with pytest.warns(RuntimeWarning) as caught:
        plugins.activate()
    messages = [str(w.message) for w in caught]
    assert any("activating the broken runtime failed: RuntimeError: no device answers" in m for m in messages)
    assert any("registering the broken_kernels provider failed" in m for m in messages)
    broken = next(s for s in plugins.statuses if s.name == "flagos-broken")
    assert broken.runtime is None and len(broken.problems) == 2
    host = next(s for s in plugins.statuses if s.name == "flagos-core")
    assert host.runtime == "host"
    # Its conf may route to the provider that is missing: not applied.
    assert all(name != "flagos-broken" for name, _ in plugins.confs())


def test_asking_for_the_broken_runtime_is_a_clear_error(plugins, monkeypatch):
    monkeypatch.setenv("FLAGOS_RUNTIME", "broken")
    with pytest.raises(_plugins.PluginError, match="FLAGOS_RUNTIME=broken: activating it failed: RuntimeError: no device answers"):
        plugins.activate()


def test_when_no_runtime_activates_the_error_says_why():
    # The host runtime refuses a bad FLAGOS_HOST_DEVICES; with nothing to fall
    # back on, importing names that, not a later "no runtime is active".
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
    out = subprocess.run([sys.executable, "-c", "import torch, flagos_core"], capture_output=True, text=True,
                         timeout=120, env={**env, "FLAGOS_HOST_DEVICES": "0", "FLAGOS_DISCOVER_PLUGINS": "0"})
    assert out.returncode != 0
    assert ("no device runtime could be activated; the host runtime: ValueError: FLAGOS_HOST_DEVICES must be "
            "between 1 and 64, got 0") in out.stderr
    assert "import flagos_core (or torch, which autoloads it) first" not in out.stderr


def _plugin(name, **hooks):
    module = types.ModuleType(name.replace("-", "_"))
    module.flagos_plugin_info = hookimpl(lambda: PluginInfo(name, "0.1"))
    for hook, function in hooks.items():
        setattr(module, hook, function)
    return module


def test_plugins_pluggy_refuses_are_listed_once_as_refused(monkeypatch):
    # A hook with other arguments than its spec, a hook name no spec has (a
    # misspelling: it would never be called), and a second plugin of one
    # name are refused; each was listed as loaded too, and the misspelling
    # not at all.
    p = _plugins.Plugins()
    for entry, module in (
        ("wrong-arguments", _plugin("flagos-wrong", flagos_extend_device_module=hookimpl(lambda mod, runtime: None))),
        ("misspelled", _plugin("flagos-misspelled", flagos_provider=hookimpl(lambda: []))),
        ("first", _plugin("flagos-twice")),
        ("second", _plugin("flagos-twice")),
    ):
        try:
            p._register(module, entry)
        except Exception as error:  # as discover() records what loading raises
            p.statuses.append(_plugins.PluginStatus(entry, "0.1", False, f"loading it failed: {error}"))
    states = [(s.name, s.loaded) for s in p.statuses]
    assert states == [("flagos-core", True), ("wrong-arguments", False), ("misspelled", False),
                      ("flagos-twice", True), ("flagos-twice", False)]
    assert "unknown hook 'flagos_provider'" in p.statuses[2].reason
    assert "another loaded plugin is named flagos-twice" in p.statuses[4].reason


def test_a_string_abi_version_is_named_as_the_mistake():
    info = PluginInfo("flagos-str", "0.1", abi_version=str(flagos_core._C.PLUGIN_ABI_VERSION))
    assert "abi_version must be an int (or None), got str" in _plugins.build_mismatch(info)


def test_a_runtime_that_does_not_activate_falls_back(monkeypatch):
    monkeypatch.delenv("FLAGOS_RUNTIME", raising=False)
    if flagos_core.runtime()["name"] != "host":
        pytest.skip("checks the fallback to the host runtime")
    p = _plugins.Plugins()
    p._register(_plugin("flagos-idle", flagos_runtimes=hookimpl(lambda: [RuntimeSpec(
        "idle", priority=1000, is_available=lambda: True, activate=lambda: None)])), "idle")
    # The host runtime is already active in this process, so the check after
    # activate() cannot tell here: the idle runtime's own call is what fails.
    monkeypatch.setattr(flagos_core._C, "_has_runtime", lambda: False)
    with pytest.warns(RuntimeWarning, match="activate\\(\\) returned without activating a runtime"):
        with pytest.raises(_plugins.PluginError, match="no device runtime could be activated"):
            p.activate()


def test_a_plugins_conf_that_cannot_be_applied_is_left_out(tmp_path):
    # A vendor's broken conf must not stop `import torch` (which loads flagos
    # as a backend): that plugin's confs are left out, with a warning.
    bad = tmp_path / "bad.yaml"
    bad.write_text("routes:\n  sin: no_such_provider\n")
    good = tmp_path / "good.yaml"
    good.write_text("routes:\n  cos: cpu_fallback\n")
    refused = []
    usable = flagos_core._conf.usable_plugin_confs(
        [("flagos-bad", str(good)), ("flagos-bad", str(bad)), ("flagos-good", str(good))],
        lambda plugin, error: refused.append((plugin, str(error))))
    assert usable == [("flagos-good", str(good))]
    assert refused and refused[0][0] == "flagos-bad" and "no_such_provider" in refused[0][1]


def _raise(message):
    def hook(*args, **kwargs):
        raise RuntimeError(message)
    return hook


@pytest.mark.parametrize("hook,implementation,problem", [
    ("flagos_runtimes", _raise("runtimes boom"), "its flagos_runtimes hook failed: RuntimeError: runtimes boom"),
    ("flagos_runtimes", lambda: [RuntimeSpec("vend", 1000, is_available=_raise("probe boom"), activate=lambda: None)],
     "the vend runtime's is_available() failed: RuntimeError: probe boom"),
    ("flagos_providers", _raise("providers boom"), "its flagos_providers hook failed: RuntimeError: providers boom"),
    ("flagos_providers", lambda: ProviderSpec("p", register=lambda: None),
     "returned ProviderSpec; expected a list, each item a flagos_core.hookspecs.ProviderSpec"),
    ("flagos_confs", _raise("confs boom"), "its flagos_confs hook failed: RuntimeError: confs boom"),
    ("flagos_confs", lambda: ["a.yaml", None], "its list holds a NoneType; each item must be a path"),
], ids=["runtimes raises", "is_available raises", "providers raises", "providers not a list", "confs raises",
        "confs holds None"])
def test_a_hook_that_raises_or_returns_the_wrong_type_is_the_plugins_problem(monkeypatch, hook, implementation,
                                                                              problem):
    # Each was torch's failure: `import torch` raised "Failed to load the
    # backend extension". The plugin's result is left out, with a warning,
    # and listed in plugins().
    monkeypatch.delenv("FLAGOS_RUNTIME", raising=False)
    if flagos_core.runtime()["name"] != "host":
        pytest.skip("checks against the host runtime's set-up")
    p = _plugins.Plugins()
    p._register(_plugin("flagos-faulty", **{hook: hookimpl(implementation)}), "faulty")
    with pytest.warns(RuntimeWarning, match="plugin flagos-faulty 0.1: "):
        p.activate()
        confs = p.confs()
    faulty = next(s for s in p.statuses if s.name == "flagos-faulty")
    assert any(problem in message for message in faulty.problems), faulty.problems
    # What is left is what is good: no None path, no conf of a plugin whose provider is missing.
    assert [path for name, path in confs if name == "flagos-faulty"] == (["a.yaml"] if hook == "flagos_confs" and
                                                                        "None" in problem else [])


def test_an_extend_hook_that_raises_is_the_plugins_problem():
    p = _plugins.Plugins()
    p._register(_plugin("flagos-extends", flagos_extend_device_module=hookimpl(_raise("extend boom"))), "extends")
    with pytest.warns(RuntimeWarning, match="its flagos_extend_device_module hook failed: RuntimeError: extend boom"):
        p.extend_device_module(types.ModuleType("m"), "host")


@pytest.mark.parametrize("info,reason", [
    (lambda: None, "its flagos_plugin_info hook returned NoneType; expected a flagos_core.hookspecs.PluginInfo"),
    (lambda: PluginInfo("flagos-bool", "0.1", abi_version=True), "abi_version must be an int (or None), got bool"),
])
def test_a_bad_plugin_info_is_refused_naming_the_mistake(info, reason):
    p = _plugins.Plugins()
    module = types.ModuleType("flagos_bad_info")
    module.flagos_plugin_info = hookimpl(info)
    p._register(module, "bad-info")
    assert not p.statuses[-1].loaded and reason in p.statuses[-1].reason
