"""Routing confs: layers, file formats, globs, `default:`, and their errors."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import flagos_core
from flagos_core import _C, _conf

REPO = Path(__file__).resolve().parents[1]
# The active runtime's own provider (host, cuda, ...): its kernels on native aliases.
NATIVE = flagos_core.runtime()["name"]


@pytest.fixture(autouse=True)
def restore_routes(monkeypatch):
    """Routes are process-global: put every one back as it was."""
    before = {name: (_C._route(name), _C._route_layer(name)) for name in _C._slot_names()}
    monkeypatch.setattr(_conf, "_applied", dict(_conf._applied))
    monkeypatch.setattr(_conf, "beneath", dict(_conf.beneath))
    yield
    for name, (provider, layer) in before.items():
        if (_C._route(name), _C._route_layer(name)) != (provider, layer):
            _C._clear_route(name)
            if not layer.startswith("default"):
                _C._set_route(name, provider, layer)


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


def run_python(code, **env):
    """Run `code` in a fresh interpreter with only the given FLAGOS_* variables."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FLAGOS_")}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env={**clean, **env},
        capture_output=True, text=True, timeout=120)


def conf_error(tmp_path, text, name="bad.yaml"):
    path = write(tmp_path / name, text)
    with pytest.raises(flagos_core.ConfError) as info:
        flagos_core.load_conf(path)
    return str(info.value), path


# ---------------------------------------------------------------- routing


def test_conf_route_sends_calls_to_that_provider_and_results_match_cpu(tmp_path):
    path = write(tmp_path / "r.yaml", """\
        routes:
          add.Tensor: cpu_fallback
        """)
    assert flagos_core.load_conf(path) == {"add.Tensor": "cpu_fallback"}
    assert flagos_core.route("add.Tensor") == "cpu_fallback"
    assert flagos_core.route_layer("add.Tensor") == f"conf:{path}:2"
    a, b = torch.randn(5, 7), torch.randn(5, 7)
    with flagos_core.trace() as t:
        out = a.to("flagos") + b.to("flagos")
    assert t.counts[("add.Tensor", "cpu_fallback")] == 1
    assert ("add.Tensor", NATIVE) not in t.counts
    assert "add.Tensor" in t.fallbacks
    assert torch.equal(out.cpu(), a + b)


def test_exact_name_beats_glob_beats_default(tmp_path):
    path = write(tmp_path / "g.yaml", f"""\
        default: cpu_fallback
        routes:
          _foreach_add.List: cpu_fallback
          "_foreach_*": {NATIVE}
        """)
    flagos_core.load_conf(path)
    assert (flagos_core.route("mul.Tensor"), flagos_core.route_layer("mul.Tensor")) == (
        "cpu_fallback", f"conf:{path}:1")
    assert (flagos_core.route("_foreach_mul.List"), flagos_core.route_layer("_foreach_mul.List")) == (
        NATIVE, f"conf:{path}:4")
    assert (flagos_core.route("_foreach_add.List"), flagos_core.route_layer("_foreach_add.List")) == (
        "cpu_fallback", f"conf:{path}:3")
    xs = [torch.randn(3), torch.randn(4)]
    ys = [torch.randn(3), torch.randn(4)]
    fx, fy = [x.to("flagos") for x in xs], [y.to("flagos") for y in ys]
    with flagos_core.trace() as t:
        added = torch._foreach_add(fx, fy)
        multiplied = torch._foreach_mul(fx, fy)
        product = fx[0] * fy[0]
    assert t.counts[("_foreach_add.List", "cpu_fallback")] == 1
    assert t.counts[("_foreach_mul.List", NATIVE)] == 1
    assert t.counts[("mul.Tensor", "cpu_fallback")] == 1
    for got, want in zip(added + multiplied, torch._foreach_add(xs, ys) + torch._foreach_mul(xs, ys)):
        assert torch.equal(got.cpu(), want)
    assert torch.equal(product.cpu(), xs[0] * ys[0])


def test_default_skips_ops_its_provider_cannot_serve(tmp_path):
    unservable = next(n for n in _C._slot_names() if not _C._can_serve(n, "cpu_fallback"))
    before = (flagos_core.route(unservable), flagos_core.route_layer(unservable))
    applied = flagos_core.load_conf(write(tmp_path / "d.yaml", "default: cpu_fallback\n"))
    assert unservable not in applied
    assert (flagos_core.route(unservable), flagos_core.route_layer(unservable)) == before
    servable = [n for n in _C._slot_names() if _C._can_serve(n, "cpu_fallback")]
    assert sorted(applied) == sorted(servable)
    assert all(flagos_core.route(n) == "cpu_fallback" for n in servable)


def test_later_glob_in_a_file_wins(tmp_path):
    path = write(tmp_path / "g.yaml", f"""\
        routes:
          "_foreach_*": cpu_fallback
          "_foreach_add*": {NATIVE}
        """)
    flagos_core.load_conf(path)
    assert flagos_core.route_layer("_foreach_add.List") == f"conf:{path}:3"
    assert flagos_core.route("_foreach_sub.List") == "cpu_fallback"


def test_include_is_relative_and_the_including_file_wins(tmp_path):
    base = write(tmp_path / "sub" / "base.yaml", """\
        routes:
          add.Tensor: cpu_fallback
          mul.Tensor: cpu_fallback
        """)
    main = write(tmp_path / "main.yaml", f"""\
        include: sub/base.yaml
        routes:
          mul.Tensor: {NATIVE}
        """)
    flagos_core.load_conf(main)
    assert (flagos_core.route("add.Tensor"), flagos_core.route_layer("add.Tensor")) == (
        "cpu_fallback", f"conf:{base}:2")
    assert (flagos_core.route("mul.Tensor"), flagos_core.route_layer("mul.Tensor")) == (
        NATIVE, f"conf:{main}:3")


def test_include_cycle_is_an_error(tmp_path):
    write(tmp_path / "b.yaml", "include: [a.yaml]\n")
    message, a = conf_error(tmp_path, "routes: {}\ninclude: [b.yaml]\n", name="a.yaml")
    assert "include cycle" in message
    assert f"{tmp_path / 'b.yaml'}:1" in message
    assert f"{a} -> {tmp_path / 'b.yaml'} -> {a}" in message


def test_missing_include_names_the_including_line(tmp_path):
    message, path = conf_error(tmp_path, "include:\n  - nowhere.yaml\n")
    assert message.startswith(f"{path}:2: cannot read {tmp_path / 'nowhere.yaml'}")


def test_upstream_dotconf_format(tmp_path):
    write(tmp_path / "extra.conf", "mul.Tensor = cpu_fallback\n")
    path = write(tmp_path / "ops.conf", """\
        # upstream torch-fl format
        include extra.conf

        add.Tensor = cpu_fallback   # trailing comment
        sub.Tensor=cpu_fallback
        """)
    assert flagos_core.load_conf(path) == {
        "mul.Tensor": "cpu_fallback", "add.Tensor": "cpu_fallback", "sub.Tensor": "cpu_fallback"}
    assert flagos_core.route_layer("add.Tensor") == f"conf:{path}:4"
    assert flagos_core.route_layer("sub.Tensor") == f"conf:{path}:5"
    assert flagos_core.route_layer("mul.Tensor") == f"conf:{tmp_path / 'extra.conf'}:1"


def test_dotconf_bad_line_names_file_and_line(tmp_path):
    message, path = conf_error(tmp_path, "# ok\nadd.Tensor cpu_fallback\n", name="bad.conf")
    assert message.startswith(f"{path}:2: expected 'overload = provider' or 'include PATH'")


def test_an_overload_routed_twice_in_one_file_is_an_error(tmp_path):
    message, path = conf_error(tmp_path, "add.Tensor = host\nadd.Tensor = cpu_fallback\n", name="twice.conf")
    assert message == f"{path}:2: add.Tensor is routed twice (first at line 1)"
    message, path = conf_error(tmp_path, "routes:\n  add.Tensor: host\n  aten::add.Tensor: cpu_fallback\n")
    assert message == f"{path}:3: aten::add.Tensor is routed twice (first at line 2)"


def test_a_key_given_twice_at_the_top_of_a_yaml_file_is_an_error(tmp_path):
    # YAML forbids it; the parser kept the last and dropped the first.
    message, path = conf_error(tmp_path, "routes:\n  add.Tensor: host\nroutes:\n  add.Tensor: cpu_fallback\n")
    assert message == f"{path}:3: key 'routes' given twice (first at line 1)"
    message, path = conf_error(tmp_path, "default: host\ndefault: cpu_fallback\n")
    assert message == f"{path}:2: key 'default' given twice (first at line 1)"


def test_a_byte_order_mark_and_an_upper_case_extension_are_read(tmp_path):
    # Windows editors write a BOM; .conf files took it as part of the first name.
    path = tmp_path / "bom.CONF"
    path.write_bytes("\ufeffadd.Tensor = cpu_fallback\n".encode("utf-8"))
    assert flagos_core.load_conf(path) == {"add.Tensor": "cpu_fallback"}


def test_a_route_only_the_router_refuses_leaves_every_route_as_it_was(tmp_path):
    # abs is composite: the router refuses its route after add.Tensor's was set.
    before = (flagos_core.route("add.Tensor"), flagos_core.route_layer("add.Tensor"))
    message, path = conf_error(tmp_path, "routes:\n  add.Tensor: cpu_fallback\n  abs: host\n")
    assert message.startswith(f"{path}:3: abs cannot be routed")
    assert (flagos_core.route("add.Tensor"), flagos_core.route_layer("add.Tensor")) == before


def test_a_file_that_is_not_utf8_is_a_conf_error(tmp_path):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe x\n")
    with pytest.raises(flagos_core.ConfError, match=f"{path} is not UTF-8 text"):
        flagos_core.load_conf(path)


def test_nothing_is_applied_when_a_file_has_an_error(tmp_path):
    before = flagos_core.route_layer("add.Tensor")
    message, path = conf_error(tmp_path, "routes:\n  add.Tensor: cpu_fallback\n  mul.Tensor: nope\n")
    assert message.startswith(f"{path}:3: unknown provider 'nope'")
    assert flagos_core.route_layer("add.Tensor") == before


# ---------------------------------------------------------------- error texts


def test_malformed_yaml_names_file_and_line(tmp_path):
    message, path = conf_error(tmp_path, f"routes:\n  add.Tensor: {NATIVE}\n  mul.Tensor: [{NATIVE}\n")
    assert message.startswith(f"{path}:4: malformed YAML")
    assert "line 3" in message


def test_unknown_provider_lists_the_valid_ones(tmp_path):
    message, path = conf_error(tmp_path, f"routes:\n  add.Tensor: {NATIVE}\n  mul.Tensor: no_such_provider\n")
    assert message == (
        f"{path}:3: unknown provider 'no_such_provider' for mul.Tensor; valid providers: "
        + ", ".join(flagos_core.providers()))
    assert "cpu_fallback" in message and NATIVE in message


def test_unknown_op_suggests_the_nearest_names(tmp_path):
    message, path = conf_error(tmp_path, f"routes:\n  add.Tensr: {NATIVE}\n")
    assert message.startswith(f"{path}:2: unknown overload 'add.Tensr'; did you mean add.Tensor")


def test_glob_matching_nothing_is_an_error(tmp_path):
    message, path = conf_error(tmp_path, f"routes:\n  'no_such_op*': {NATIVE}\n")
    assert message == f"{path}:2: 'no_such_op*' matches no overload"


def test_provider_without_a_kernel_is_an_error(tmp_path):
    op = next(n for n in _C._slot_names() if not _C._can_serve(n, NATIVE))
    message, path = conf_error(tmp_path, f"routes:\n  {op}: {NATIVE}\n")
    assert message == f"{path}:2: provider '{NATIVE}' has no kernel for {op}"


def test_unknown_key_and_wrong_shapes(tmp_path):
    message, path = conf_error(tmp_path, f"rout:\n  add.Tensor: {NATIVE}\n")
    assert message == f"{path}:1: unknown key 'rout'; expected include, default or routes"
    message, path = conf_error(tmp_path, "routes: [add.Tensor]\n")
    assert message == f"{path}:1: expected a mapping of overload (or glob) to provider"
    message, path = conf_error(tmp_path, f"routes:\n  add.Tensor: {NATIVE}\n  add.Tensor: cpu_fallback\n")
    assert message == f"{path}:3: add.Tensor is routed twice (first at line 2)"


def test_shipped_core_defaults_are_valid():
    confs = _conf.read_file(_conf.DEFAULT_CONF, "core")
    plan = _conf.Plan()
    for conf in confs:
        plan.add(conf)


# ---------------------------------------------------------------- layers


def test_layers_apply_in_order_later_wins(tmp_path, monkeypatch):
    core = write(tmp_path / "core.yaml", """\
        routes:
          add.Tensor: cpu_fallback
          mul.Tensor: cpu_fallback
          sub.Tensor: cpu_fallback
          div.Tensor: cpu_fallback
          neg: cpu_fallback
        """)
    plugin = write(tmp_path / "plugin.yaml", f"""\
        routes:
          mul.Tensor: {NATIVE}
          sub.Tensor: {NATIVE}
          div.Tensor: {NATIVE}
          neg: {NATIVE}
        """)
    user = write(tmp_path / "user.conf", "sub.Tensor = cpu_fallback\ndiv.Tensor = cpu_fallback\nneg = cpu_fallback\n")
    environ = {"FLAGOS_CONF": str(user), "FLAGOS_OP_div__Tensor": NATIVE, "FLAGOS_OP_neg": NATIVE}
    monkeypatch.setattr(_conf, "DEFAULT_CONF", str(core))
    flagos_core.set_route("neg", "cpu_fallback")  # the runtime API beats every conf layer
    _conf.apply_all([("myplugin", str(plugin))], environ)
    got = {op: (flagos_core.route(op), flagos_core.route_layer(op))
           for op in ("add.Tensor", "mul.Tensor", "sub.Tensor", "div.Tensor", "neg")}
    assert got == {
        "add.Tensor": ("cpu_fallback", f"core:{core}:2"),
        "mul.Tensor": (NATIVE, f"plugin:myplugin:{plugin}:2"),
        "sub.Tensor": ("cpu_fallback", f"conf:{user}:1"),
        "div.Tensor": (NATIVE, "env:FLAGOS_OP_div__Tensor"),
        "neg": ("cpu_fallback", "api"),
    }
    # Resolving again without those layers puts their routes back to default.
    monkeypatch.setattr(_conf, "DEFAULT_CONF", str(write(tmp_path / "empty.yaml", "")))
    _conf.apply_all([], {})
    assert all(flagos_core.route_layer(op) == "default" for op in ("add.Tensor", "mul.Tensor", "div.Tensor"))
    assert flagos_core.route_layer("neg") == "api"


def test_flagos_conf_path_list_later_file_wins(tmp_path):
    first = write(tmp_path / "first.yaml", "routes:\n  add.Tensor: cpu_fallback\n  mul.Tensor: cpu_fallback\n")
    second = write(tmp_path / "second.yaml", f"routes:\n  mul.Tensor: {NATIVE}\n")
    _conf.apply_all([], {"FLAGOS_CONF": os.pathsep.join([str(first), "", str(second)])})
    assert flagos_core.route_layer("add.Tensor") == f"conf:{first}:2"
    assert (flagos_core.route("mul.Tensor"), flagos_core.route_layer("mul.Tensor")) == (
        NATIVE, f"conf:{second}:2")


def test_missing_flagos_conf_file_is_an_error(tmp_path):
    missing = tmp_path / "missing.yaml"
    with pytest.raises(flagos_core.ConfError, match=f"FLAGOS_CONF: cannot read {missing}"):
        _conf.apply_all([], {"FLAGOS_CONF": str(missing)})


# ---------------------------------------------------------------- at import


def test_env_var_routes_at_import_and_results_match_cpu():
    result = run_python("""\
        import torch, flagos_core
        a = torch.arange(6.0)
        with flagos_core.trace() as t:
            out = (a.to("flagos") + a.to("flagos")).cpu()
        assert torch.equal(out, a + a)
        print(flagos_core.route("add.Tensor"), flagos_core.route_layer("add.Tensor"), dict(t.counts))
        print(flagos_core.route("__lshift__.Scalar"), flagos_core.route_layer("__lshift__.Scalar"))
        """, FLAGOS_OP_add__Tensor="cpu_fallback", FLAGOS_OP___lshift____Scalar="cpu_fallback")
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first.startswith("cpu_fallback env:FLAGOS_OP_add__Tensor {('add.Tensor', 'cpu_fallback'): 1")
    assert second == "cpu_fallback env:FLAGOS_OP___lshift____Scalar"


def test_a_composite_overload_cannot_be_routed():
    # Outside the generated table, a composite (here __and__.Tensor, which
    # calls bitwise_and) never reaches the router: the route was taken and
    # reported, and every call still ran where it did.
    result = run_python("import flagos_core", FLAGOS_OP___and____Tensor="cpu_fallback")
    assert result.returncode != 0
    assert ("FLAGOS_OP___and____Tensor: __and__.Tensor cannot be routed: PyTorch runs it as a composite on every "
            "device") in result.stderr
    with pytest.raises(RuntimeError, match="abs cannot be routed: .* route those instead"):
        flagos_core.set_route("abs", "cpu_fallback")
    assert flagos_core.route_layer("abs.out") == "default"


def test_dropping_an_api_route_goes_back_to_the_layer_beneath(tmp_path):
    # routes() restores what each overload had; clear_route drops the API
    # layer only, back to a conf's or the environment's route.
    path = write(tmp_path / "c.yaml", "routes:\n  mul.Tensor: cpu_fallback\n")
    result = run_python("""\
        import torch, flagos_core as fc
        def show(op): print(fc.route(op), fc.route_layer(op))
        with fc.routes({"mul.Tensor": "NATIVE", "add.Tensor": "NATIVE"}):
            show("mul.Tensor")
        show("mul.Tensor"); show("add.Tensor")
        fc.set_route(torch.ops.aten.add.Tensor, "NATIVE"); fc.clear_route("aten::add.Tensor"); show("add.Tensor")
        fc.set_route("neg", "cpu_fallback")
        with fc.routes({"neg": "NATIVE"}):
            pass
        show("neg")
        fc.clear_route("neg"); show("neg")
        """.replace("NATIVE", NATIVE), FLAGOS_CONF=str(path), FLAGOS_OP_add__Tensor="cpu_fallback")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"{NATIVE} api", f"cpu_fallback conf:{path}:2", "cpu_fallback env:FLAGOS_OP_add__Tensor",
        "cpu_fallback env:FLAGOS_OP_add__Tensor", "cpu_fallback api", f"{NATIVE} default"]


def test_routing_calls_name_wrong_argument_types():
    with pytest.raises(TypeError, match="an overload is named by a string such as 'add.Tensor'"):
        flagos_core.set_route(None, NATIVE)
    with pytest.raises(TypeError, match="a provider is named by a string"):
        flagos_core.set_route("add.Tensor", 3)
    with pytest.raises(TypeError, match=r"routes\(\) takes a mapping"):
        with flagos_core.routes(["add.Tensor"]):
            pass


def test_flagos_conf_is_applied_at_import(tmp_path):
    path = write(tmp_path / "c.yaml", "routes:\n  mul.Tensor: cpu_fallback\n")
    result = run_python(
        "import flagos_core; print(flagos_core.route('mul.Tensor'), flagos_core.route_layer('mul.Tensor'))",
        FLAGOS_CONF=str(path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"cpu_fallback conf:{path}:2"


def test_errors_are_raised_at_import():
    result = run_python("import flagos_core", FLAGOS_OP_add__Tensr=NATIVE)
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("flagos_core._conf.ConfError: FLAGOS_OP_add__Tensr: unknown overload 'add.Tensr'")
    assert "FLAGOS_OP_add__Tensor" in last
    result = run_python("import flagos_core", FLAGOS_OP_add__Tensor="no_such_provider")
    assert result.returncode != 0
    valid = ", ".join(flagos_core.providers())
    assert f"unknown provider 'no_such_provider' for add.Tensor; valid providers: {valid}" in result.stderr


def test_log_dispatch_env_var():
    code = "import torch, flagos_core; torch.ones(3, device='flagos').add(1)"
    result = run_python(code, FLAGOS_LOG_DISPATCH="1")
    assert result.returncode == 0, result.stderr
    assert f"flagos: add.Tensor -> {NATIVE}" in result.stderr.splitlines()
    assert "flagos:" not in run_python(code).stderr
    assert "FLAGOS_LOG_DISPATCH: expected 1 or 0" in run_python(code, FLAGOS_LOG_DISPATCH="maybe").stderr


def test_a_python_provider_is_checked_when_registered():
    # Nothing is registered when a name or kernel is wrong.
    with pytest.raises(ValueError, match="a provider needs a non-empty name"):
        flagos_core.register_python_provider("", {})
    with pytest.raises(ValueError, match="provider 'checked': unknown operator overload 'add.Tensr'"):
        flagos_core.register_python_provider("checked", {"add.Tensr": lambda *args: None})
    with pytest.raises(TypeError, match="the kernel for add.Tensor must be callable, got int"):
        flagos_core.register_python_provider("checked", {"add.Tensor": 5})
    # One overload under two keys (one kernel was dropped), a name or kernels of the wrong type.
    with pytest.raises(ValueError, match="'aten::neg' and 'neg' name one overload"):
        flagos_core.register_python_provider("checked", {"neg": torch.neg, "aten::neg": torch.neg})
    with pytest.raises(TypeError, match="a provider is named by a string, got int 5"):
        flagos_core.register_python_provider(5, {})
    with pytest.raises(TypeError, match="kernels are a mapping"):
        flagos_core.register_python_provider("checked", 5)
    assert "checked" not in flagos_core.providers()
    with pytest.raises(TypeError, match="set_whole_ops takes True or False, not '0'"):
        flagos_core.set_whole_ops("0")


@pytest.mark.parametrize("overload,why", [
    ("view", "it returns a view of its input"),
    ("as_strided", "it returns a view of its input"),
    ("resize_", "it changes its input's storage, size or strides in place"),
    ("set_.source_Storage", "it changes its input's storage, size or strides in place"),
])
def test_cpu_fallback_refuses_ops_a_copy_would_break(overload, why, tmp_path):
    # Through a copy to the CPU and back a view would come back a copy (writes
    # to it lost), and resize_ recursed until the stack overflowed.
    with pytest.raises(RuntimeError, match=f"cpu_fallback cannot serve {overload}: {why}"):
        flagos_core.set_route(overload, "cpu_fallback")
    assert flagos_core.route(overload) != "cpu_fallback"
    # A conf gets the same reason, before it applies any route.
    message, path = conf_error(tmp_path, f"routes:\n  add.Tensor: cpu_fallback\n  {overload}: cpu_fallback\n")
    assert message.startswith(f"{path}:3: cpu_fallback cannot serve {overload}: {why}")
    assert flagos_core.route("add.Tensor") == NATIVE


def test_a_default_to_cpu_fallback_keeps_views_on_their_provider(tmp_path):
    path = write(tmp_path / "all.yaml", "default: cpu_fallback\n")
    flagos_core.load_conf(path)
    assert flagos_core.route("view") == NATIVE and flagos_core.route("add.Tensor") == "cpu_fallback"
    a = torch.zeros(4, device="flagos")
    b = a.view(2, 2)
    b[0, 0] = 5
    a.resize_(6)
    assert a.cpu().tolist()[:4] == [5.0, 0.0, 0.0, 0.0]


def test_a_python_providers_results_are_checked():
    # Another type where a Tensor is due, or a CPU tensor from a call on
    # flagos tensors, is an error naming the provider, not a silent result.
    assert _python_provider_errors(
        """{"div.Tensor": lambda a, b: 2.0, "sub.Tensor": lambda a, b, alpha=1: torch.ones(5)}""",
        "torch.ones(2, device='flagos')", ["x / x", "x - x"], "(x - x)") == [
        "flagos: provider 'checked' returned float as result 0 of aten::div.Tensor, which is a Tensor",
        "flagos: provider 'checked' returned a tensor on cpu as result 0 of aten::sub.Tensor, called on "
        "flagos tensors: return flagos tensors (.to(the input's device))",
        "[0.0, 0.0]"]


def _python_provider_errors(kernels, tensor, calls, after):
    """In a fresh process (a provider cannot be unregistered): with `kernels`
    registered as provider `checked` and routed, each call's values or the
    first line of its error; then, the routes gone again, `after`'s values."""
    result = run_python(f"""\
        import torch, flagos_core
        kernels = {kernels}
        flagos_core.register_python_provider("checked", kernels)
        x = {tensor}
        with flagos_core.routes({{name: "checked" for name in kernels}}):
            for call in {calls!r}:
                try:
                    print(eval(call).cpu().tolist())
                except RuntimeError as e:
                    print(str(e).splitlines()[0])
        print({after}.cpu().tolist())
        """)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_a_python_kernels_silent_mistakes_are_errors():
    # A lone Tensor result of None (a missing return), and a new tensor from
    # an in-place overload (the argument left as it was): both came back
    # silently. Writing the argument and returning it works.
    assert _python_provider_errors(
        """{"exp": lambda x: None, "relu_": lambda x: torch.relu(x),
                   "neg_": lambda x: (flagos_core.as_native(x).neg_(), x)[1]}""",
        "torch.tensor([-1.0, 2.0], device='flagos')", ["torch.exp(x)", "x.relu_()", "x.neg_()"], "x") == [
        "flagos: provider 'checked' returned None for aten::exp, which returns a Tensor (a missing return?)",
        "flagos: provider 'checked' returned a new tensor from aten::relu_, which writes its argument and returns "
        "it: write the argument (through as_native(t) for a native kernel) and return it",
        "[1.0, -2.0]", "[1.0, -2.0]"]


def test_a_python_kernels_wrong_result_kinds_are_named():
    # A tensor for a tuple result (max.dim), a string for a bool result
    # (equal), and another flagos device's tensor: each gave a pybind or
    # torch error naming neither provider nor op, or (the device) nothing.
    result = run_python("""\
        import torch, flagos_core
        flagos_core.register_python_provider("checked", {
            "max.dim": lambda x, dim, keepdim: x, "equal": lambda a, b: "yes",
            "neg": lambda x: torch.zeros(2, device="flagos:1")})
        x = torch.tensor([-1.0, 2.0], device="flagos")
        with flagos_core.routes({"max.dim": "checked", "equal": "checked", "neg": "checked"}):
            for call in (lambda: x.max(0), lambda: torch.equal(x, x), lambda: -x):
                try:
                    call()
                    print("no error")
                except RuntimeError as e:
                    print(str(e).splitlines()[0])
        print(flagos_core.route(torch.ops.aten.neg.default))
        """, FLAGOS_HOST_DEVICES="2")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "flagos: provider 'checked' returned Tensor for aten::max.dim, which returns 2 values: return a tuple of them",
        "flagos: provider 'checked' returned str as result 0 of aten::equal, which is bool",
        "flagos: provider 'checked' returned a tensor on flagos:1 as result 0 of aten::neg, called on flagos:0 "
        "tensors: return tensors of the call's device",
        "host"]
