"""Routing confs: which provider serves each overload, resolved in layers.

Later wins: core defaults (confs/default.yaml) < confs shipped by plugins <
user files (FLAGOS_CONF, an os.pathsep-separated list) < the environment
(FLAGOS_OP_<overload>=provider, "." written "__") < the runtime API
(flagos_core.set_route). Within one file an exact overload name beats a glob,
and a glob beats the file's `default:`.

YAML schema (every key optional):

    include: [base.yaml]          # applied before this file, relative to it
    default: host                 # every overload the provider can serve
    routes:
      add.Tensor: cpu_fallback    # an exact overload name
      "_foreach_*": host          # an fnmatch glob over overload names

Files ending in `.conf` use the upstream torch-fl format instead: one
`overload = provider` or `include PATH` per line, `#` starts a comment.

Every route is recorded with the layer that set it ("conf:/path/file.yaml:12",
"env:FLAGOS_OP_add__Tensor", ...), which flagos_core.route_layer reports.
"""

import dataclasses
import difflib
import fnmatch
import os
import re
import sys

import yaml

from . import _C

CONF_ENV = "FLAGOS_CONF"
OP_ENV_PREFIX = "FLAGOS_OP_"
LOG_ENV = "FLAGOS_LOG_DISPATCH"
WHOLE_OPS_ENV = "FLAGOS_WHOLE_OPS"
DEFAULT_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "confs", "default.yaml")
FALLBACK = "cpu_fallback"

# A ConfError met while `python -m flagos_core` imports the package: the CLI
# reports it as a one-line error instead of a traceback.
import_error = None


class ConfError(ValueError):
    """A routing conf that cannot be applied; the message says where and why."""


@dataclasses.dataclass
class Rule:
    pattern: str  # an overload name, or an fnmatch glob over overload names
    provider: str
    where: str  # for messages: "/path/file.yaml:12" or "FLAGOS_OP_add__Tensor"
    layer: str  # recorded with the route: "conf:/path/file.yaml:12", ...


@dataclasses.dataclass
class Conf:
    """The rules of one file (its includes are Confs applied before it)."""

    default: Rule = None
    routes: list = dataclasses.field(default_factory=list)


# ---------------------------------------------------------------- reading files


def read_file(path, kind="conf", origin=None, _stack=()):
    """The Confs of `path` in the order they apply: its includes, then itself.

    kind prefixes each layer string ("core", "plugin:NAME", "conf"); origin
    names who asked for the file, for the error when it cannot be read."""
    path = os.path.abspath(os.path.expanduser(path))
    real = os.path.realpath(path)
    if real in _stack:
        chain = " -> ".join(_stack[_stack.index(real):] + (real,))
        raise ConfError(f"{origin}: include cycle: {chain}")
    try:
        with open(path, encoding="utf-8-sig") as f:  # a byte-order mark (Windows editors) is not text
            text = f.read()
    except OSError as e:
        raise ConfError(f"{origin or path}: cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfError(f"{origin or path}: {path} is not UTF-8 text (byte {e.start} cannot be read)") from None
    parse = _parse_dotconf if path.lower().endswith(".conf") else _parse_yaml
    includes, conf = parse(text, path, kind)
    confs = []
    for target, line in includes:
        target = os.path.join(os.path.dirname(path), os.path.expanduser(target))
        confs += read_file(target, kind, f"{path}:{line}", _stack + (real,))
    return confs + [conf]


def _rule(pattern, provider, path, line, kind):
    return Rule(pattern, provider, f"{path}:{line}", f"{kind}:{path}:{line}")


_INCLUDE_LINE = re.compile(r"include\s+(\S.*)")
_ROUTE_LINE = re.compile(r"([^\s=]+)\s*=\s*([^\s=]+)")


def _parse_dotconf(text, path, kind):
    includes, conf, seen = [], Conf(), {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        include, route = _INCLUDE_LINE.fullmatch(line), _ROUTE_LINE.fullmatch(line)
        if include:
            includes.append((include.group(1).strip(), number))
        elif route:
            pattern = _canonical(route.group(1))
            if pattern in seen:
                raise ConfError(f"{path}:{number}: {pattern} is routed twice (first at line {seen[pattern]})")
            seen[pattern] = number
            conf.routes.append(_rule(route.group(1), route.group(2), path, number, kind))
        else:
            raise ConfError(f"{path}:{number}: expected 'overload = provider' or 'include PATH', got {line!r}")
    return includes, conf


def _parse_yaml(text, path, kind):
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else path
        problem = getattr(e, "problem", None) or str(e)
        context, context_mark = getattr(e, "context", None), getattr(e, "context_mark", None)
        if context and context_mark:
            problem += f" ({context} at line {context_mark.line + 1})"
        raise ConfError(f"{where}: malformed YAML: {problem}") from None
    includes, conf = [], Conf()
    if _is_null(root):
        return includes, conf
    _expect(root, yaml.MappingNode, "a mapping with keys include, default, routes", path)
    seen = {}
    for key, value in root.value:
        name = _scalar(key, "a key", path)
        if name in seen:  # YAML forbids it; a parser would keep the last and drop the first silently
            raise ConfError(f"{path}:{_line(key)}: key {name!r} given twice (first at line {seen[name]})")
        seen[name] = _line(key)
        if name == "include":
            nodes = value.value if isinstance(value, yaml.SequenceNode) else [] if _is_null(value) else [value]
            includes += [(_scalar(node, "an include path", path), _line(node)) for node in nodes]
        elif name == "default":
            conf.default = _rule("*", _scalar(value, "a provider name", path), path, _line(key), kind)
        elif name == "routes":
            if not _is_null(value):
                conf.routes += _yaml_routes(value, path, kind)
        else:
            raise ConfError(f"{path}:{_line(key)}: unknown key {name!r}; expected include, default or routes")
    return includes, conf


def _yaml_routes(node, path, kind):
    _expect(node, yaml.MappingNode, "a mapping of overload (or glob) to provider", path)
    rules, seen = [], {}
    for key, value in node.value:
        pattern = _scalar(key, "an overload name or glob", path)
        overload = _canonical(pattern)  # add.Tensor and aten::add.Tensor are one overload
        if overload in seen:
            raise ConfError(f"{path}:{_line(key)}: {pattern} is routed twice (first at line {seen[overload]})")
        seen[overload] = _line(key)
        rules.append(_rule(pattern, _scalar(value, "a provider name", path), path, _line(key), kind))
    return rules


def _line(node):
    return node.start_mark.line + 1


def _is_null(node):
    return node is None or (isinstance(node, yaml.ScalarNode) and node.tag == "tag:yaml.org,2002:null")


def _expect(node, node_type, what, path):
    if not isinstance(node, node_type):
        raise ConfError(f"{path}:{_line(node)}: expected {what}")


def _scalar(node, what, path):
    _expect(node, yaml.ScalarNode, what, path)
    if not node.value.strip():
        raise ConfError(f"{path}:{_line(node)}: expected {what}, got nothing")
    return node.value.strip()


# ---------------------------------------------------------------- the environment


def env_conf(environ):
    """The FLAGOS_OP_<overload>=provider variables as one Conf."""
    conf = Conf()
    for var in sorted(environ):
        if var.startswith(OP_ENV_PREFIX):
            overload = _decode(var[len(OP_ENV_PREFIX):])
            conf.routes.append(Rule(overload, environ[var].strip(), var, f"env:{var}"))
    return conf


def _decode(key):
    """The overload a FLAGOS_OP_ suffix names: add__Tensor is add.Tensor.

    Names may hold "__" themselves (__and__.Tensor), so the encoded form is
    looked up among the known overloads rather than decoded."""
    for names in (_C._slot_names, _aten_op_names):
        for name in names():
            if name.replace(".", "__") == key:
                return name
    return key.replace("__", ".")


def _aten_op_names():
    import torch

    return [n[len("aten::"):] for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]


def _env_name(overload):
    return OP_ENV_PREFIX + overload.replace(".", "__")


def env_switch(environ, name, default):
    """An on/off environment variable (1/0, true/false, yes/no, on/off)."""
    value = environ.get(name, "").strip().lower()
    if value == "":
        return default
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfError(f"{name}: expected 1 or 0, got {environ[name]!r}")


def log_dispatch_requested(environ):
    return env_switch(environ, LOG_ENV, False)


# ---------------------------------------------------------------- resolving


class Plan:
    """Routes resolved from Confs added in order: a later rule replaces an
    earlier one. Everything is checked here, before any route is applied."""

    def __init__(self):
        self.providers = list(_C._providers())
        self.names = list(_C._slot_names())
        self.known = set(self.names)
        self.routes = {}  # overload -> Rule
        self._serves = {}

    def serves(self, provider):
        if provider not in self._serves:
            self._serves[provider] = {name for name in self.names if _C._can_serve(name, provider)}
        return self._serves[provider]

    def add(self, conf):
        if conf.default is not None:
            self._check_provider(conf.default, "default")
            for name in self.serves(conf.default.provider):
                self.routes[name] = conf.default
        globs = [rule for rule in conf.routes if _is_glob(rule.pattern)]
        exact = [rule for rule in conf.routes if not _is_glob(rule.pattern)]
        for rule in globs:
            self._add_glob(rule)
        for rule in exact:
            self.routes[self._overload(rule)] = rule
        return self

    def _add_glob(self, rule):
        self._check_provider(rule, rule.pattern)
        pattern = _canonical(rule.pattern)
        matched = [name for name in self.names if fnmatch.fnmatchcase(name, pattern)]
        if not matched:
            raise ConfError(f"{rule.where}: {rule.pattern!r} matches no overload")
        servable = [name for name in matched if name in self.serves(rule.provider)]
        if not servable:
            raise ConfError(
                f"{rule.where}: provider {rule.provider!r} has no kernel for any of the "
                f"{len(matched)} overloads {rule.pattern!r} matches")
        for name in servable:
            self.routes[name] = rule

    def _overload(self, rule):
        self._check_provider(rule, rule.pattern)
        name = _canonical(rule.pattern)
        if name in self.known and name in self.serves(rule.provider):
            return name
        if name not in self.known:  # not in the generated table: any operator the dispatcher knows
            try:
                _C._can_serve(name, rule.provider)
            except RuntimeError:
                raise ConfError(f"{rule.where}: unknown overload {name!r}; {self._suggest(name, rule)}") from None
        # The router's own reason (a composite, a view cpu_fallback would
        # copy, no kernel), so no route is applied that it would refuse.
        refusal = _C._route_refusal(name, rule.provider)
        if refusal:
            raise ConfError(f"{rule.where}: {refusal}")
        return name

    def _check_provider(self, rule, what):
        if rule.provider not in self.providers:
            raise ConfError(
                f"{rule.where}: unknown provider {rule.provider!r} for {what}; "
                f"valid providers: {', '.join(self.providers)}")

    def _suggest(self, name, rule):
        close = difflib.get_close_matches(name, self.names, n=3, cutoff=0.6)
        if not close:
            return "no overload has a similar name (python -m flagos_core routes lists them)"
        if rule.where.startswith(OP_ENV_PREFIX):
            close = [f"{_env_name(c)} ({c})" for c in close]
        return "did you mean " + ", ".join(close) + "?"


def _is_glob(pattern):
    return any(c in pattern for c in "*?[")


def _canonical(name):
    return name[len("aten::"):] if name.startswith("aten::") else name


# ---------------------------------------------------------------- applying

# overload -> layer string, as set by the last apply_all().
_applied = {}
# overload -> (provider, layer) of its route below the runtime API (a conf's
# or the environment's), so that dropping an API route goes back to it.
beneath = {}


def layers(plugin_confs=(), environ=None):
    """Every Conf in the order applied: core, plugins, FLAGOS_CONF files, env."""
    environ = os.environ if environ is None else environ
    confs = read_file(DEFAULT_CONF, "core", "core defaults")
    for plugin, path in plugin_confs:
        confs += read_file(path, f"plugin:{plugin}", f"plugin {plugin}")
    for path in environ.get(CONF_ENV, "").split(os.pathsep):
        if path.strip():
            confs += read_file(path.strip(), "conf", CONF_ENV)
    confs.append(env_conf(environ))
    return confs


def apply_all(plugin_confs=(), environ=None):
    """Resolve every layer below the runtime API and route accordingly.

    plugin_confs: (plugin_name, path) pairs, in plugin order. Routes set
    through the runtime API (layer "api") are kept; routes an earlier
    apply_all set and this one does not go back to their default.
    Returns {overload: provider} of the routes applied."""
    plan = Plan()
    for conf in layers(plugin_confs, environ):
        plan.add(conf)
    for name, layer in list(_applied.items()):
        if name not in plan.routes and _C._route_layer(name) == layer:
            _C._clear_route(name)
        del _applied[name]
    routes = {name: rule for name, rule in plan.routes.items() if _C._route_layer(name) != "api"}
    _apply(routes)
    _applied.update((name, rule.layer) for name, rule in routes.items())
    beneath.clear()
    beneath.update((name, (rule.provider, rule.layer)) for name, rule in plan.routes.items())
    return {name: rule.provider for name, rule in routes.items()}


def load_conf(path):
    """Apply one conf file (and what it includes) now, over every route.

    Returns {overload: provider} of the routes applied."""
    plan = Plan()
    for conf in read_file(path, "conf", "load_conf"):
        plan.add(conf)
    _apply(plan.routes)
    beneath.update((name, (rule.provider, rule.layer)) for name, rule in plan.routes.items())
    return {name: rule.provider for name, rule in plan.routes.items()}


def _apply(routes):
    """Set every route of a Plan (which checked each with the router)."""
    for name, rule in routes.items():
        _C._set_route(name, rule.provider, rule.layer)


def usable_plugin_confs(plugin_confs, refuse):
    """The plugin confs that resolve on their own. A plugin's conf that does
    not (unreadable, malformed, an unknown overload or provider) leaves out
    all of that plugin's confs, through `refuse(plugin, error)`: a vendor's
    mistake must not stop `import torch` for everyone (torch loads flagos as
    a backend at its own import). The user's own confs still raise."""
    refused = set()
    plan = Plan()  # one for the checks: its overload names and providers' kernels found once
    for plugin, path in plugin_confs:
        if plugin in refused:
            continue
        try:
            for conf in read_file(path, f"plugin:{plugin}", f"plugin {plugin}"):
                plan.add(conf)
        except ConfError as error:
            refused.add(plugin)
            refuse(plugin, error)
    return [(plugin, path) for plugin, path in plugin_confs if plugin not in refused]


def configure(plugin_confs=(), refuse_plugin_conf=None):
    """Import-time setup: FLAGOS_LOG_DISPATCH, then every conf layer (the
    plugins' that resolve, where `refuse_plugin_conf` is given)."""
    global import_error
    try:
        if log_dispatch_requested(os.environ):
            _C._set_log_dispatch(True)
        if not env_switch(os.environ, WHOLE_OPS_ENV, True):
            _C._set_whole_ops(False)
        if refuse_plugin_conf is not None:
            plugin_confs = usable_plugin_confs(plugin_confs, refuse_plugin_conf)
        apply_all(plugin_confs)
    except ConfError as e:
        if not _imported_by_cli():
            raise
        import_error = e


def _imported_by_cli():
    """Whether this import is `python -m flagos_core ...` locating its module."""
    argv = getattr(sys, "orig_argv", [])
    modules = ("flagos_core", "flagos_core.__main__")
    invoked = any(
        arg in [f"-m{m}" for m in modules] or (arg == "-m" and argv[i + 1:i + 2] and argv[i + 1] in modules)
        for i, arg in enumerate(argv))
    return sys.argv[:1] == ["-m"] and invoked
