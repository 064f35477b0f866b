"""torch.compile's default backend, inductor, on flagos: code generated for
the native device.

Inductor generates code per device type and has none for flagos. It needs
none: a flagos tensor's memory is the native device's (`as_native`, no
copy). Inductor traces a flagos graph as for any device (AOT autograd:
functionalisation, decompositions, the forward/backward split), and each
graph it then lowers (forward, backward, or inference) is handed to it for
the native device instead: every flagos device in the graph and its fake
values replaced by the native one. Its joint-graph passes, which rewrite the
traced graph before the split and choose by device type, see the native
device's fake values too. The decompositions applied while tracing still
see flagos tensors (for a GPU that is the same choice: flagos is not CPU).
What it compiles is what it compiles for native tensors, with the native
device's code generation. An op that flagos
routes to a provider other than the runtime's own (the composite provider,
a plugin's kernels, cpu_fallback, a user's route) stays a call through
flagos's routing in the compiled code, as an opaque op of its own: the
native device may have no kernel for it (CUDA has none for the CPU-named
flash attention overloads that SDPA calls on flagos, which flagos-cuda
serves with CUDA's flash kernels). A call runs that
code on native aliases of the flagos arguments and takes its flagos results
back (`from_native`, no copy). Autograd stays on flagos tensors (AOT
autograd's function around the compiled forward and backward); no native
tensor enters an autograd graph (see _native_backward.py for why not).

AOT autograd's cache serves flagos graphs too: an entry records what the
crossing needs, and a hit puts it back (_inductor_cache.py).

Hooked where inductor's `compile_fx` module is first imported (by
torch.compile's inductor wrapper, `backend="inductor"` and its modes, or by
any other road: `torch._dynamo.optimize("inductor")`, a backend that calls
`compile_fx`, `torch._inductor.compile`), which makes its `compile_fx` hand
flagos graphs over that way. Importing inductor is slow, so flagos's import
does not; it waits for the first import. Graphs without flagos tensors
compile as before. Inductor's code generators reached by another road still
stop with MESSAGE, not a KeyError.
"""

import copy
import importlib.abc
import importlib.util
import sys

import torch
from torch.utils import _pytree as pytree

BACKEND = "flagos"
MESSAGE = (
    "flagos: inductor was asked to generate code for the flagos device itself; it has none. torch.compile(model) "
    "(inductor, the default) compiles flagos graphs for the native device; backend='aot_eager' (or 'eager') "
    "runs the captured graph on flagos's kernels.")

# The names inductor looks up on torch.flagos (torch/_inductor/codegen/common.py).
CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")


COMPILE_FX = "torch._inductor.compile_fx"


class _HandOverOnImport(importlib.abc.MetaPathFinder):
    """Finds inductor's compile_fx module as Python would, and wraps its
    compile_fx as soon as the module has run, before any importer binds it."""

    def find_spec(self, name, path, target=None):
        if name != COMPILE_FX:
            return None
        sys.meta_path.remove(self)  # once; and the lookup below must not come back here
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            run = spec.loader.exec_module

            def exec_module(module):
                run(module)
                _hand_flagos_graphs_to_native(module)

            spec.loader.exec_module = exec_module
        return spec


# The operators flagos (and torch, and the plugins) gave a PrivateUse1
# kernel by the end of flagos's import: a kernel any other operator has
# there later is a user's own (torch.library), which the native device's
# kernel must not replace in compiled code.
_own_kernels = frozenset()


def install():
    """Makes inductor's compile_fx compile flagos graphs for the native device."""
    global _own_kernels
    _own_kernels = frozenset(torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1"))
    if COMPILE_FX in sys.modules:
        _hand_flagos_graphs_to_native(sys.modules[COMPILE_FX])
    elif not any(isinstance(finder, _HandOverOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _HandOverOnImport())


def _hand_flagos_graphs_to_native(module):
    """Wraps inductor's compile_fx (`module`'s): for a flagos graph, its
    inner compiler (what lowers each traced graph) gets the graph for the
    native device; other graphs pass through."""
    if getattr(module.compile_fx, "_flagos_native", False):
        return
    compile_fx = module.compile_fx

    def compile_fx_for_flagos(model_, example_inputs_, *args, **kwargs):
        if args or not _uses_flagos(model_, example_inputs_):
            return compile_fx(model_, example_inputs_, *args, **kwargs)
        kwargs["inner_compile"] = NativeInnerCompile(kwargs.get("inner_compile", module.compile_fx_inner))
        from ._inductor_cache import aot_cache_keeps_the_crossing

        if aot_cache_keeps_the_crossing():
            return compile_fx(model_, example_inputs_, *args, **kwargs)
        # Where AOT autograd's cache cannot keep the crossing (another torch,
        # or its bundled entries, which hold the compiled code itself), a hit
        # would run inductor's native code without it: off for flagos graphs.
        # Inductor's own cache (of the native graphs) still serves.
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return compile_fx(model_, example_inputs_, *args, **kwargs)

    compile_fx_for_flagos._flagos_native = True
    compile_fx_for_flagos.__wrapped__ = compile_fx
    module.compile_fx = compile_fx_for_flagos
    module.joint_graph_passes = _passes_on_native(module.joint_graph_passes)


def _passes_on_native(joint_graph_passes):
    """Inductor's joint-graph passes (run on the forward and backward graph
    before it is split) for a flagos graph: run with the graph's fake values
    on the native device, then put back. Some passes choose by device type:
    on a GPU a batch-1 bmm becomes an mm (which cuBLAS computes with other
    rounding), and the flagos graph must get what the native one gets. Not
    where the graph also holds tensors of the native device itself (CPU ones,
    on the host runtime): a pass could no longer tell them from flagos's, and
    would take a copy between the two for a no-op."""

    def passes(gm, *args, **kwargs):
        if not _uses_flagos(gm, ()) or _holds_native_tensors(gm):
            return joint_graph_passes(gm, *args, **kwargs)
        to_native = _FakesOnDevice.to_native()
        _map_values(gm, to_native)
        args, kwargs = pytree.tree_map(_native_constant, (args, kwargs))  # the input device, where given
        gm = joint_graph_passes(gm, *args, **kwargs)
        _map_values(gm, to_native.inverse())
        return gm

    passes.__wrapped__ = joint_graph_passes
    return passes


def _holds_native_tensors(gm):
    from . import _C

    native_type = _C._native_device_type()
    return any(isinstance(value, torch.Tensor) and value.device.type == native_type
               for node in gm.graph.nodes for value in pytree.tree_leaves(node.meta.get("val")))


def _map_values(gm, mover):
    for node in gm.graph.nodes:
        if "val" in node.meta:
            node.meta["val"] = pytree.tree_map(mover, node.meta["val"])


def _is_flagos(value):
    return isinstance(value, torch.Tensor) and value.device.type == BACKEND


def _native_device(device):
    """The native device a flagos device's tensors alias, named as the native
    tensors name it (the runtime knows: CPU's have no index), so the graph is
    the one the native device's own compile makes and inductor's cache serves
    both."""
    from . import _C

    return _C._native_device(0 if device.index is None else device.index)


def _node_value(node):
    return node.meta.get("val", node.meta.get("example_value"))


def _uses_flagos(gm, inputs):
    if any(_is_flagos(x) for x in inputs):
        return True
    return isinstance(gm, torch.fx.GraphModule) and any(
        _is_flagos(_node_value(n)) or _names_flagos(n.args) or _names_flagos(n.kwargs) for n in gm.graph.nodes)


def _names_flagos(args):
    return any(_native_constant(a) is not a for a in pytree.tree_leaves(args))


def _native_constant(value):
    """A device constant in the graph (torch.device or its string) on flagos: the native device's; else as it is."""
    if isinstance(value, torch.device) and value.type == BACKEND:
        return _native_device(value)
    if isinstance(value, str) and (value == BACKEND or value.startswith(BACKEND + ":")):
        return str(_native_device(torch.device(value)))
    return value


class NativeInnerCompile:
    """Inductor's inner compiler for flagos graphs: lowers the graph for the
    native device and returns code that runs on flagos tensors."""

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, gm, example_inputs, **kwargs):
        if not _uses_flagos(gm, example_inputs):
            return self.inner(gm, example_inputs, **kwargs)
        native_gm, native_inputs, output_devices, through, routes = _graph_on_native(gm, example_inputs)
        positions = [i for i, index in enumerate(output_devices) if index is not None]
        return NativeCompiledGraph(self.inner(native_gm, native_inputs, **kwargs), positions,
                                   [output_devices[i] for i in positions], through, routes)


def _on_native(inputs, on_native=None):
    """Example inputs (fake or real) moved to the native device they alias;
    fakes by `on_native` where given (the mover of their graph's values, so
    that an input stays its placeholder's value)."""
    from torch._guards import detect_fake_mode

    from . import as_native

    if detect_fake_mode(inputs) is None:  # real example inputs: their native aliases
        return [as_native(x) if _is_flagos(x) else x for x in inputs]
    on_native = on_native or _FakesOnDevice.to_native()
    return [on_native(x) for x in inputs]


def _graph_on_native(gm, inputs):
    """A copy of a traced graph for the native device: device constants,
    tensor attributes and every node's fake value moved over. Also the
    example inputs so moved, the flagos device index of each output (None
    for one that is not a flagos tensor: on the host runtime native and CPU
    results look alike, only these become flagos again, each on its own
    device), the ops it calls through flagos (_through_flagos's arguments),
    and the route of each op in it (what decided which go through flagos)."""
    from torch._guards import detect_fake_mode

    output_node = next(n for n in gm.graph.nodes if n.op == "output")
    output_devices = [_flagos_index_of(_node_value(a) if isinstance(a, torch.fx.Node) else a)
                      for a in pytree.tree_leaves(output_node.args)]
    on_native = _FakesOnDevice.to_native()
    through, routes = [], {}
    native_gm = _module_on_native(gm, on_native, through, routes, detect_fake_mode(inputs) is not None)
    return native_gm, _on_native(inputs, on_native), output_devices, through, routes


def _flagos_index_of(value):
    return (value.device.index or 0) if _is_flagos(value) else None


def _module_on_native(gm, on_native, through, routes, moves_fakes):
    """_graph_on_native's copy of one graph module, and of the subgraphs it
    holds (torch.cond's branches, while_loop's and map's bodies), whose
    values inductor checks against the graph's as well."""
    from . import as_native

    # A copy that pickles as the original would (its class name, tracer and
    # code generator), so that where flagos's graph is the native device's
    # (the host runtime), inductor's cache key is the same and one entry
    # serves both.
    graph = torch.fx.Graph(tracer_cls=gm.graph._tracer_cls, tracer_extras=gm.graph._tracer_extras)
    graph._codegen = copy.deepcopy(gm.graph._codegen)
    graph.output(graph.graph_copy(gm.graph, {}))
    native_gm = torch.fx.GraphModule(gm, graph, class_name=type(gm).__name__)
    for node in native_gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            name = node.target.name()
            if name not in routes:
                routes[name] = route_of(name)
            mask = _flagos_tensor_mask(node) if _served_elsewhere(node.target, routes[name]) else ()
            if any(mask):  # factories (no flagos tensor in) are the native device's
                numbers = _numbers_in_tensor_slots(node)
                through.append((node.target._schema.name, node.target._overloadname, mask, numbers))
                node.target = _through_flagos(node.target, mask, numbers)
        node.args = pytree.tree_map(_native_constant, node.args)
        node.kwargs = pytree.tree_map(_native_constant, node.kwargs)
        if node.op == "get_attr":
            value = getattr(native_gm, node.target, None)
            if _is_flagos(value):
                _set_attribute(native_gm, node.target, as_native(value))
            elif isinstance(value, torch.fx.GraphModule) and _uses_flagos(value, ()):
                _set_attribute(native_gm, node.target,
                               _module_on_native(value, on_native, through, routes, moves_fakes))
    native_gm.recompile()
    _attributes_in_order_of(native_gm, gm)
    if moves_fakes:
        _map_values(native_gm, on_native)
    return native_gm


def _attributes_in_order_of(copied, original):
    """Orders the copy's attributes as the original's (those the original
    lacks last): a module pickles its attributes in their order."""
    ours = copied.__dict__
    ordered = {name: ours[name] for name in original.__dict__ if name in ours}
    ordered.update((name, value) for name, value in ours.items() if name not in ordered)
    ours.clear()
    ours.update(ordered)


# route_of's answer for an overload a user's own flagos kernel serves.
USERS_KERNEL = "a user's PrivateUse1 kernel"


def route_of(name):
    """The provider flagos routes overload `name` to now (USERS_KERNEL where
    a user's own PrivateUse1 kernel serves it); None where it has no slot (a
    composite op, which decomposes). AOT autograd's cache compares it too."""
    from . import _C

    if _users_kernel(name):
        return USERS_KERNEL
    try:
        return _C._route(name)
    except RuntimeError:
        return None


def _served_elsewhere(op, provider):
    """Whether this ATen overload, routed to `provider` (route_of), goes to
    a provider other than the runtime's own."""
    from . import _C

    schema = op._schema
    if any(a.alias_info is not None for a in list(schema.arguments) + list(schema.returns)):
        return False  # views and writes: left to the native kernels (functionalised graphs have few)
    return provider is not None and provider != _C._default_provider()


def _users_kernel(name):
    """Whether overload `name` has a PrivateUse1 kernel a user registered (a
    custom op's kernel for flagos, or an override of an ATen op's): the
    compiled code must call it, as eager code does, not the native device's
    kernel."""
    if not torch._C._dispatch_has_kernel_for_dispatch_key(name, "PrivateUse1"):
        return False
    if name not in _own_kernels:
        return True
    # Registered over flagos's own: flagos's then shows as inactive.
    return any(line.startswith("PrivateUse1 (inactive)") for line in torch._C._dispatch_dump(name).splitlines())


def _flagos_tensor_mask(node):
    """For each tensor among a node's arguments, in order: whether it is a flagos tensor."""
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return tuple(_is_flagos(_node_value(x)) for x in leaves
                 if isinstance(x, torch.fx.Node) and isinstance(_node_value(x), torch.Tensor))


def _numbers_in_tensor_slots(node):
    """The indices of the schema's Tensor arguments to which the traced graph
    passes a Python number (`x * 3` traces as mul.Tensor(x, 3))."""
    numbers = []
    for i, argument in enumerate(node.target._schema.arguments):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(argument.name)
        if str(argument.type) == "Tensor" and isinstance(value, (bool, int, float, complex)):
            numbers.append(i)
    return tuple(numbers)


def _schema_arguments(op, numbers):
    """`op`'s schema from its arguments on, with Scalar for the Tensor
    arguments `numbers` lists (the op itself takes a number there)."""
    schema = str(op._schema)
    opened, closed = schema.index("("), schema.rindex(") ->")
    if not numbers:
        return schema[opened:]
    parts, depth, start = [], 0, opened + 1
    for i in range(opened + 1, closed):  # split at the commas outside brackets (defaults such as [1, 1])
        if schema[i] in "[(":
            depth += 1
        elif schema[i] in "])":
            depth -= 1
        elif schema[i] == "," and depth == 0:
            parts.append(schema[start:i].strip())
            start = i + 1
    parts.append(schema[start:closed].strip())
    index = 0
    for j, part in enumerate(parts):
        if part == "*":
            continue
        if index in numbers:
            parts[j] = "Scalar" + part[len("Tensor"):]
        index += 1
    return "(" + ", ".join(parts) + schema[closed:]


_THROUGH_FLAGOS = {}
_LIBRARY = []


def _through_flagos(op, mask, numbers=()):
    """An opaque op with `op`'s schema whose native kernel calls `op` on the
    flagos tensors over the same memory (those `mask` marks), so flagos's
    routing serves it, and gives the results' native aliases back. The
    Tensor arguments `numbers` lists take Python numbers, as the graph passes."""
    from . import _C, as_native, from_native

    key = (op, mask, numbers)
    if key in _THROUGH_FLAGOS:
        return _THROUGH_FLAGOS[key]
    if not _LIBRARY:
        _LIBRARY.append(torch.library.Library("flagos_compiled", "FRAGMENT"))
    library = _LIBRARY[0]
    qualified = op._schema.name.replace("::", "_")
    name = f"{qualified}_{op._overloadname}_{''.join('1' if m else '0' for m in mask)}".replace(".", "_")
    if numbers:
        name += "_numbers_" + "_".join(map(str, numbers))
    library.define(name + _schema_arguments(op, numbers))

    def call(args, kwargs, to_flagos, to_native):
        leaves, spec = pytree.tree_flatten((args, kwargs))
        marks = iter(mask)
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and next(marks, False):
                leaves[i] = to_flagos(leaf)
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        return pytree.tree_map(lambda t: to_native(t) if _is_flagos(t) else t, op(*args, **kwargs))

    def kernel(*args, **kwargs):
        return call(args, kwargs, lambda t: from_native(t, t.device.index or 0), as_native)

    def fake(*args, **kwargs):  # what the op gives for flagos tensors (the native device's kernel may not exist)
        return call(args, kwargs, lambda t: _fake_on(t, torch.device(BACKEND, t.device.index or 0)),
                    lambda t: _fake_on(t, _native_device(t.device)))

    library.impl(name, kernel, torch._C._dispatch_key_for_device(_C._native_device_type()))
    torch.library.register_fake(f"flagos_compiled::{name}", fake, lib=library)
    through = getattr(torch.ops.flagos_compiled, name).default
    _THROUGH_FLAGOS[key] = through
    return through


def _fake_on(t, device):
    return torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)


def _set_attribute(module, target, value):
    *owner_path, name = target.split(".")
    owner = module
    for part in owner_path:
        owner = getattr(owner, part)
    owner._parameters.pop(name, None)
    owner._buffers.pop(name, None)
    setattr(owner, name, value)


class _FakesOnDevice:
    """A fake tensor that `moves` says moves, as the same fake on another
    device (`device_for` of it): a new FakeTensor over the same meta memory,
    so sizes (symbolic ones too), strides and shared memory stay exactly as
    traced. Not traced afresh: meta kernels choose strides by device type
    (CPU's convolutions keep channels_last), and the graph's views were
    traced with flagos's. One fake gives one moved fake, so identities hold
    (an example input is its placeholder's value)."""

    def __init__(self, moves, device_for):
        self.moves = moves
        self.device_for = device_for
        self.made = {}

    def __call__(self, value):
        from torch._subclasses.fake_tensor import FakeTensor

        if not (isinstance(value, FakeTensor) and self.moves(value)):
            return value
        found = self.made.get(id(value))
        if found is None:
            from torch.utils._mode_utils import no_dispatch

            with no_dispatch():  # a meta tensor over the fake's own (meta) memory
                elem = torch.empty(0, device="meta", dtype=value.dtype)
                elem.set_(value.untyped_storage(), value.storage_offset(), value.size(), value.stride())
            moved = FakeTensor(value.fake_mode, elem, self.device_for(value))
            if moved.requires_grad != value.requires_grad and moved.is_leaf:
                moved.requires_grad_(value.requires_grad)
            found = self.made[id(value)] = (value, moved)  # holds `value`: its id stays its own
        return found[1]

    @classmethod
    def to_native(cls):
        """Flagos fakes moved to the native device they alias."""
        return cls(_is_flagos, lambda value: _native_device(value.device))

    def inverse(self):
        """The move back from the native device to flagos: a fake made here
        gives the one it was made from, a fake on the native device made
        since (by a pass) a flagos one (so the graph must have held no native
        tensors of its own)."""
        from . import _C

        originals = [original for original, _ in self.made.values()]
        flagos = originals[0].device if originals else torch.device(BACKEND, 0)
        native_type = _C._native_device_type()
        back = _FakesOnDevice(lambda value: value.device.type == native_type, lambda value: flagos)
        back.made = {id(moved): (moved, original) for original, moved in self.made.values()}
        return back


class NativeCompiledGraph:
    """Inductor's compiled code for the native device, called with flagos
    tensors (AOT autograd's boxed convention: one list of arguments, which
    the call may empty). The conversions run in C++: a training step of a
    small model passes about a hundred tensors each way."""

    # What AOT autograd's cache reads of inductor's compiled graph when it
    # makes an entry (the native graph's entry in inductor's cache).
    CACHE_ATTRIBUTES = ("_fx_graph_cache_key", "_fx_graph_cache_debug_lines", "guards_expr", "_time_taken_ns")

    def __init__(self, compiled, flagos_positions, indices, through=(), routes=None):
        # On the instance: wrappers (torch._dynamo.disable) copy its __dict__.
        self._boxed_call = True
        self.compiled = compiled
        self.flagos_positions = list(flagos_positions)
        self.indices = list(indices)  # the flagos device index of each of those results
        # What a cache entry needs to put the crossing back (_inductor_cache.py).
        self._flagos_crossing = dict(positions=self.flagos_positions, through=list(through), index=self.indices,
                                     routes=dict(routes or {}))
        if getattr(compiled, "_fx_graph_cache_key", None) is not None:  # (some torch asks hasattr only)
            for name in self.CACHE_ATTRIBUTES:
                if hasattr(compiled, name):
                    setattr(self, name, getattr(compiled, name))

    def __call__(self, args):
        from . import _C

        if not isinstance(args, list):
            args = list(args)
        _C._native_arguments_in_place(args)
        if getattr(self.compiled, "_boxed_call", False):
            results = self.compiled(args)
        else:
            results = self.compiled(*args)
            args.clear()
        if type(results) in (list, tuple):  # the usual: no pytree walk
            leaves, rebuild = list(results), type(results)
        else:
            leaves, spec = pytree.tree_flatten(results)
            rebuild = lambda done: pytree.tree_unflatten(done, spec)  # noqa: E731
        del results  # so that results nothing else holds are taken over, not wrapped
        _C._flagos_results_in_place(leaves, self.flagos_positions, self.indices)
        return rebuild(leaves)


class _RaisesOnUse(type):
    # Inductor reads class attributes of a generator (supports_caching, ...)
    # before it makes one: any of them raises MESSAGE too.
    def __getattr__(cls, name):
        raise RuntimeError(MESSAGE)


class InductorUnsupported(metaclass=_RaisesOnUse):
    """Stands for every code generator: making or asking one raises MESSAGE."""

    def __init__(self, *args, **kwargs):
        raise RuntimeError(MESSAGE)


def codegen_attribute():
    """What torch.flagos gives for each of CODEGEN_NAMES; also gives inductor
    the device-op table it reads before any generator (so it reaches ours)."""
    from torch._inductor.codegen import common

    # Torch's own tables first: before torch 2.13, inductor fills them on
    # its first lookup only while none is registered, so an entry of ours
    # made first left CUDA without its own (on a GPU with torch 2.11, every
    # CUDA graph compiled in the process then failed to import). Also before
    # importing CPU's module, which registers CPU's table as it loads.
    common.get_device_op_overrides("cpu")
    from torch._inductor.codegen.cpu_device_op_overrides import CpuDeviceOpOverrides

    common.register_device_op_overrides("flagos", CpuDeviceOpOverrides())
    return InductorUnsupported
