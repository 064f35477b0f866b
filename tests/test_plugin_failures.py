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
