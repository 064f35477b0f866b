"""Generate the router's op table, and the typed kernels of hot overloads, from the
installed torch's native_functions.yaml.

Run at build time (CMake), never checked in: the table always matches the torch the
core is compiled against, so no torch minor version is pinned.

Each row is one ATen overload that has a backend kernel (CPU or CUDA, directly or via a
structured delegate): those are the overloads that reach the PrivateUse1 key and need a
routing slot. One that also has a CompositeImplicitAutograd kernel is listed too, since
CPU and CUDA run their own kernel for it rather than the decomposition, and flagos must
run what they run. Purely composite overloads decompose as PyTorch decomposes them and
are left to the dispatcher.

The overloads of the ops listed in device_stub_ops.txt get a row as well:
their one kernel (CompositeExplicitAutograd) picks a device's computation by
its device type, which only CPU and CUDA register.

Overloads whose base name is listed in typed_ops.txt (every overload with
--typed all, none with --typed none) get a typed kernel (core/TypedKernel.h)
when their C++ signature allows it; the rest are served boxed. Typed kernels
are spread over --shards files so the build compiles them in parallel.

The functional overloads of the purely composite ops listed in whole_ops.txt
get a row too and a typed kernel for AutogradPrivateUse1 and PrivateUse1
(core/WholeKernel.h, WholeKernels.cpp): without autograd the op runs whole on
the native device, its decomposition there; with autograd it decomposes on
flagos as any composite op does.
"""

import argparse
import os

import torchgen
from torchgen.api.types import CppSignatureGroup, DispatcherSignature
from torchgen.context import native_function_manager
from torchgen.gen import parse_native_yaml
from torchgen.model import DeviceCheckType, DispatchKey, SchemaKind

BACKENDS = (DispatchKey.CPU, DispatchKey.CUDA)


HERE = os.path.dirname(os.path.abspath(__file__))
# Argument types the typed path does not convert: those overloads stay boxed.
BOXED_ONLY_TYPES = ("Generator", "Device", "Stream", "Storage")


def parsed_native_functions():
    native_dir = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    return parse_native_yaml(os.path.join(native_dir, "native_functions.yaml"), os.path.join(native_dir, "tags.yaml"))


def routable_overloads(parsed):
    """(function, exact_device) for each overload that reaches PrivateUse1,
    and those of device_stub_ops.txt's ops."""
    by_name = {str(f.func.name): f for f in parsed.native_functions}
    indices = parsed.backend_indices
    device_stub_ops = listed_names("device_stub_ops.txt")

    def has_backend_kernel(f):
        if any(indices[k].has_kernel(f) for k in BACKENDS):
            return True
        delegate = f.structured_delegate
        return delegate is not None and has_backend_kernel(by_name[str(delegate)])

    for f in parsed.native_functions:
        if has_backend_kernel(f) or (f.root_name in device_stub_ops and f.has_composite_explicit_autograd_kernel):
            yield f, f.device_check == DeviceCheckType.ExactSame


def typed_signature_ok(f):
    """Whether TypedKernel.h can serve f's C++ (at::_ops) signature."""
    with native_function_manager(f):
        sig = DispatcherSignature.from_schema(f.func)
        args = [a.type for a in sig.arguments()]
        ret = sig.returns_type().cpp_type()
    if any(t in a for a in args for t in BOXED_ONLY_TYPES):
        return False
    if ret == "at::Tensor &":  # in-place returns its first argument, out= its last
        return bool(args) and (args[0] == "at::Tensor &" or args[-1] == "at::Tensor &")
    return "&" not in ret


def decomposition_function(f):
    """The at::compositeimplicitautograd function that is f's composite kernel,
    where its C++ signature is the dispatcher's (so a typed kernel can call it
    with its own arguments), else None."""
    with native_function_manager(f):
        group = CppSignatureGroup.from_native_function(f, method=False, fallback_binding=False)
        cpp = group.symint_signature or group.signature
        dispatcher = DispatcherSignature.from_schema(f.func)
        same = [a.type for a in cpp.arguments()] == [a.type for a in dispatcher.arguments()]
    return cpp.name() if same else None


def whole_overloads(parsed, routable):
    """(function, decomposition function) for the functional overloads of
    whole_ops.txt's ops that PyTorch decomposes for every device (`routable`:
    the names of those with a backend kernel)."""
    wanted = listed_names("whole_ops.txt")
    for f in parsed.native_functions:
        if (
            f.root_name in wanted
            and f.func.kind() == SchemaKind.functional
            and f.has_composite_implicit_autograd_kernel
            and str(f.func.name) not in routable
            and typed_signature_ok(f)
        ):
            decomposition = decomposition_function(f)
            if decomposition is not None:
                yield f, decomposition


def typed_names(choice):
    if choice == "all":
        return None
    if choice == "none":
        return set()
    return listed_names("typed_ops.txt")


def listed_names(file_name):
    """The names in one of codegen's listings (a name per line, # comments)."""
    with open(os.path.join(HERE, file_name)) as listing:
        return {line.split("#")[0].strip() for line in listing} - {""}


def render_table(rows):
    lines = [
        "// Generated at build time by flagos_core/codegen/gen_op_table.py. Do not edit.",
        '#include "core/OpTable.h"',
        "",
        "namespace flagos::generated {",
        "",
        "const OpTableRow kOpTable[] = {",
    ]
    for name, exact_device, typed in rows:
        lines.append(f'    {{"{name}", {str(exact_device).lower()}, {str(typed).lower()}}},')
    lines += [
        "};",
        "",
        "const size_t kOpTableSize = sizeof(kOpTable) / sizeof(kOpTable[0]);",
        "",
        "} // namespace flagos::generated",
        "",
    ]
    return "\n".join(lines)


def render_typed(entries):
    """One TypedKernels file: entries are (slot, overload, op struct, header)."""
    headers = sorted({h for _, _, _, h in entries})
    lines = [
        "// Generated at build time by flagos_core/codegen/gen_op_table.py. Do not edit.",
        '#include "core/TypedKernel.h"',
        "",
    ]
    lines += [f"#include <ATen/ops/{h}_ops.h>" for h in headers]
    lines += ["", "TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {"]
    for slot, overload, op, _ in entries:
        lines.append(f'  flagos::typed::registerTyped<at::_ops::{op}, {slot}>(m, "{overload}");')
    lines += ["}", ""]
    return "\n".join(lines)


def render_whole(entries):
    """WholeKernels.cpp: entries are (slot, overload, op struct, header,
    decomposition function)."""
    lines = [
        "// Generated at build time by flagos_core/codegen/gen_op_table.py. Do not edit.",
        '#include "core/WholeKernel.h"',
        "",
    ]
    for h in sorted({e[3] for e in entries}):
        lines += [f"#include <ATen/ops/{h}_ops.h>", f"#include <ATen/ops/{h}_compositeimplicitautograd_dispatch.h>"]
    lines += ["", "namespace {", ""]
    for slot, overload, op, _, decomposition in entries:
        # The composite kernel, as a type the kernel template takes.
        lines += [
            f"struct Decompose_{op} {{",
            "  template <class... A>",
            "  static auto call(A&&... args) {",
            f"    return at::compositeimplicitautograd::{decomposition}(std::forward<A>(args)...);",
            "  }",
            "};",
            "",
        ]
    lines.append("} // namespace")
    # AutogradPrivateUse1, and PrivateUse1 for calls that skip the autograd
    # keys (inference mode): the same kernel, which decides per call.
    for key in ("AutogradPrivateUse1", "PrivateUse1"):
        lines += ["", f"TORCH_LIBRARY_IMPL(aten, {key}, m) {{"]
        for slot, overload, op, _, _ in entries:
            lines.append(f'  flagos::typed::registerWhole<at::_ops::{op}, {slot}, Decompose_{op}>(m, "{overload}");')
        lines.append("}")
    lines.append("")
    return "\n".join(lines)


def write_if_changed(path, text):
    # Rewrite only on change so an unchanged torch does not trigger a rebuild.
    if os.path.exists(path) and open(path).read() == text:
        return
    with open(path, "w") as out:
        out.write(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("outdir")
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--typed", default="list", choices=("list", "all", "none"))
    args = parser.parse_args()
    wanted = typed_names(args.typed)
    parsed = parsed_native_functions()
    routable = sorted(routable_overloads(parsed), key=lambda item: str(item[0].func.name))
    rows, typed, whole = [], [], []
    for f, exact_device in routable:
        name = str(f.func.name)
        is_typed = (wanted is None or f.root_name in wanted or str(f.func.name.name) in wanted) and typed_signature_ok(f)
        if is_typed:
            typed.append((len(rows), name, f.func.name.unambiguous_name(), f.root_name))
        rows.append((name, exact_device, is_typed))
    routable_names = {str(f.func.name) for f, _ in routable}
    for f, decomposition in sorted(whole_overloads(parsed, routable_names), key=lambda e: str(e[0].func.name)):
        name = str(f.func.name)
        whole.append((len(rows), name, f.func.name.unambiguous_name(), f.root_name, decomposition))
        rows.append((name, f.device_check == DeviceCheckType.ExactSame, True))
    write_if_changed(os.path.join(args.outdir, "OpTable.cpp"), render_table(rows))
    for shard in range(args.shards):
        text = render_typed(typed[shard :: args.shards])
        write_if_changed(os.path.join(args.outdir, f"TypedKernels{shard}.cpp"), text)
    write_if_changed(os.path.join(args.outdir, "WholeKernels.cpp"), render_whole(whole))


if __name__ == "__main__":
    main()
