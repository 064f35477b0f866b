"""Plugin discovery (entry-point group `flagos.plugins`), the ABI and torch
checks, and the choice of the process's runtime."""

import dataclasses
import os
import warnings
from importlib import metadata
from typing import List, Optional

import pluggy
import torch

from . import _C, _builtin, hookspecs

ENTRY_POINT_GROUP = "flagos.plugins"
RUNTIME_ENV = "FLAGOS_RUNTIME"
# "0": the core alone, no plugin loaded (the build's profiling run uses it:
# an installed plugin may have been built against another core).
DISCOVER_ENV = "FLAGOS_DISCOVER_PLUGINS"


@dataclasses.dataclass
class PluginStatus:
    name: str
    version: str
    loaded: bool
    reason: str = ""  # why it was refused, when it was
    runtime: Optional[str] = None  # the runtime it provides, if active
    problems: List[str] = dataclasses.field(default_factory=list)  # runtime/provider set-up that failed

    def as_dict(self):
        return dataclasses.asdict(self)


class PluginError(RuntimeError):
    """A runtime choice that cannot be honoured (FLAGOS_RUNTIME)."""


def build_mismatch(info: hookspecs.PluginInfo) -> str:
    """Why a plugin's compiled code cannot be loaded into this core, or ''."""
    problems = []
    if info.abi_version is not None and (not isinstance(info.abi_version, int) or isinstance(info.abi_version, bool)):
        return (f"{info.name} {info.version}: PluginInfo.abi_version must be an int (or None), got "
                f"{type(info.abi_version).__name__} {info.abi_version!r}")
    if info.abi_version is not None and info.abi_version != _C.PLUGIN_ABI_VERSION:
        problems.append(f"plugin ABI {info.abi_version} (this core has plugin ABI {_C.PLUGIN_ABI_VERSION})")
    if info.torch_version is not None and info.torch_version != torch.__version__:
        problems.append(f"torch {info.torch_version} (this process has torch {torch.__version__})")
    if not problems:
        return ""
    return (f"{info.name} {info.version} was built for " + " and ".join(problems) +
            f"; rebuild {info.name} against flagos-core {_core_version()} and this torch")


def _core_version():
    from . import __version__

    return __version__


class Plugins:
    def __init__(self):
        self.manager = pluggy.PluginManager(hookspecs.PROJECT)
        self.manager.add_hookspecs(hookspecs)
        self.statuses: List[PluginStatus] = []
        self.owner = {}  # plugin module -> status
        self.providers_missing = set()  # plugin modules whose providers did not all register
        self._register(_builtin, entry_name=_builtin.NAME)

    def _register(self, module, entry_name):
        info_impl = getattr(module, "flagos_plugin_info", None)
        if info_impl is None:
            self.statuses.append(PluginStatus(entry_name, "?", False, "it defines no flagos_plugin_info hook"))
            return
        info = info_impl()
        if not isinstance(info, hookspecs.PluginInfo):
            self.statuses.append(PluginStatus(entry_name, "?", False, f"its flagos_plugin_info hook returned "
                                              f"{type(info).__name__}; expected a flagos_core.hookspecs.PluginInfo"))
            return
        reason = build_mismatch(info)
        if not reason and self.manager.has_plugin(info.name):
            reason = f"another loaded plugin is named {info.name} (PluginInfo.name must be unique)"
        status = PluginStatus(info.name, info.version, not reason, reason)
        if not reason:
            # Listed once registered: pluggy refuses a hook with the wrong
            # arguments, a hook name no spec has (a misspelling, which would
            # never be called), or a second plugin of the same name.
            self.manager.register(module, name=info.name)
            try:
                self.manager.check_pending()
            except Exception:
                self.manager.unregister(module)
                raise
            self.owner[module] = status
        self.statuses.append(status)

    def discover(self):
        if os.environ.get(DISCOVER_ENV, "1") == "0":
            return
        for entry in metadata.entry_points(group=ENTRY_POINT_GROUP):
            try:
                module = entry.load()
                self._register(module, entry.name)
            except (Exception, SystemExit) as error:  # a broken plugin must not break (or end) torch's import
                self.statuses.append(PluginStatus(entry.name, _dist_version(entry), False,
                                                  f"loading it failed: {type(error).__name__}: {error}"))

    def _impls(self, hook_name, **kwargs):
        """(plugin module, hook result) for each registered plugin. A hook
        that raises is its plugin's problem (a warning, and in plugins()),
        and its result is left out: a vendor's mistake must not stop
        `import torch`."""
        hook = getattr(self.manager.hook, hook_name)
        for impl in hook.get_hookimpls():
            try:
                result = impl.function(**kwargs)
            except Exception as error:
                self._problem(impl.plugin, f"its {hook_name} hook", error)
                continue
            yield impl.plugin, result

    def _listed(self, hook_name, kinds, what):
        """(plugin module, item) for each item of each plugin's list from
        `hook_name`; a result that is not a list, or an item not of `kinds`,
        is left out as that plugin's problem."""
        for plugin, result in self._impls(hook_name):
            if result is None:
                continue
            if not isinstance(result, (list, tuple)):
                self._problem(plugin, f"its {hook_name} hook",
                              TypeError(f"it returned {type(result).__name__}; expected a list, each item {what}"))
                continue
            for item in result:
                if isinstance(item, kinds):
                    yield plugin, item
                else:
                    self._problem(plugin, f"its {hook_name} hook",
                                  TypeError(f"its list holds a {type(item).__name__}; each item must be {what}"))

    def runtimes(self):
        return list(self._listed("flagos_runtimes", hookspecs.RuntimeSpec, "a flagos_core.hookspecs.RuntimeSpec"))

    def _available(self, plugin, spec):
        try:
            return bool(spec.is_available())
        except Exception as error:
            self._problem(plugin, f"the {spec.name} runtime's is_available()", error)
            return False

    def extend_device_module(self, module, runtime):
        for _ in self._impls("flagos_extend_device_module", module=module, runtime=runtime):
            pass

    def choose_runtime(self):
        """The runtimes to try, best first: the one FLAGOS_RUNTIME names, or
        every available one by priority."""
        candidates = self.runtimes()
        wanted = os.environ.get(RUNTIME_ENV)
        if wanted:
            named = [(p, s) for p, s in candidates if s.name == wanted]
            if not named:
                valid = ", ".join(sorted(s.name for _, s in candidates))
                raise PluginError(f"{RUNTIME_ENV}={wanted}: no loaded plugin provides that runtime; valid: {valid}")
            plugin, spec = named[0]
            if not self._available(plugin, spec):
                raise PluginError(f"{RUNTIME_ENV}={wanted}: the {wanted} runtime's hardware is not available here")
            return [(plugin, spec)]
        available = [(p, s) for p, s in candidates if self._available(p, s)]
        return sorted(available, key=lambda ps: -ps[1].priority)

    def _problem(self, plugin, what, error):
        status = self.owner[plugin]
        message = f"{what} failed: {type(error).__name__}: {error}"
        status.problems.append(message)
        warnings.warn(f"flagos: plugin {status.name} {status.version}: {message}", RuntimeWarning, stacklevel=3)

    def activate(self):
        """Activates the best runtime; one whose activation raises is skipped
        (with a warning, and in plugins()) for the next, unless FLAGOS_RUNTIME
        asked for it. A provider whose registration raises is skipped, and so
        are its plugin's routing confs, which may name it."""
        explicit = bool(os.environ.get(RUNTIME_ENV))
        failures = []
        for plugin, spec in self.choose_runtime():
            try:
                spec.activate()
                if not _C._has_runtime():
                    raise PluginError("activate() returned without activating a runtime")
            except Exception as error:
                if explicit:
                    raise PluginError(f"{RUNTIME_ENV}={spec.name}: activating it failed: "
                                      f"{type(error).__name__}: {error}") from error
                self._problem(plugin, f"activating the {spec.name} runtime", error)
                failures.append(f"the {spec.name} runtime: {type(error).__name__}: {error}")
                continue
            self.owner[plugin].runtime = spec.name
            break
        else:
            if failures:  # none left to fall back on: say why, not later that none is active
                raise PluginError("flagos: no device runtime could be activated; " + "; ".join(failures))
        problems_before = {plugin: len(status.problems) for plugin, status in self.owner.items()}
        for plugin, provider in self._listed("flagos_providers", hookspecs.ProviderSpec,
                                             "a flagos_core.hookspecs.ProviderSpec"):
            try:
                provider.register()
            except Exception as error:
                self._problem(plugin, f"registering the {provider.name} provider", error)
        self.providers_missing = {plugin for plugin, status in self.owner.items()
                                  if len(status.problems) > problems_before[plugin]}

    def refuse_conf(self, plugin_name, error):
        """A loaded plugin's routing conf that cannot be applied: left out,
        with a warning, and listed in plugins()."""
        status = next(s for s in self.statuses if s.name == plugin_name and s.loaded)
        message = f"its routing confs were left out: {error}"
        status.problems.append(message)
        warnings.warn(f"flagos: plugin {status.name} {status.version}: {message}", RuntimeWarning, stacklevel=3)

    def confs(self):
        """(plugin name, path) of every conf shipped by a loaded plugin."""
        out = []
        for plugin, path in self._listed("flagos_confs", (str, os.PathLike), "a path (str or os.PathLike)"):
            if plugin in self.providers_missing:
                continue  # its routes may name the provider that is missing
            out.append((self.owner[plugin].name, os.fspath(path)))
        return out


def _dist_version(entry):
    try:
        return entry.dist.version if entry.dist else "?"
    except Exception:
        return "?"
