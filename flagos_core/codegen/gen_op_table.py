"""Generate the router's op table from the installed torch's native_functions.yaml.

Run at build time (CMake), never checked in: the table always matches the torch the
core is compiled against, so no torch minor version is pinned.

Each row is one ATen overload that has a backend kernel (CPU or CUDA, directly or via a
structured delegate): those are the overloads that reach the PrivateUse1 key and need a
routing slot. One that also has a CompositeImplicitAutograd kernel is listed too, since
CPU and CUDA run their own kernel for it rather than the decomposition, and flagos must
run what they run. Purely composite overloads decompose as PyTorch decomposes them and
are left to the dispatcher.
"""

import argparse
import os

import torchgen
from torchgen.gen import parse_native_yaml
from torchgen.model import DeviceCheckType, DispatchKey

BACKENDS = (DispatchKey.CPU, DispatchKey.CUDA)


def routable_overloads():
    native_dir = os.path.join(os.path.dirname(torchgen.__file__), "packaged", "ATen", "native")
    parsed = parse_native_yaml(
        os.path.join(native_dir, "native_functions.yaml"), os.path.join(native_dir, "tags.yaml")
    )
    by_name = {str(f.func.name): f for f in parsed.native_functions}
    indices = parsed.backend_indices

    def has_backend_kernel(f):
        if any(indices[k].has_kernel(f) for k in BACKENDS):
            return True
        delegate = f.structured_delegate
        return delegate is not None and has_backend_kernel(by_name[str(delegate)])

    for f in parsed.native_functions:
        if not has_backend_kernel(f):
            continue
        name = str(f.func.name)
        exact_device = f.device_check == DeviceCheckType.ExactSame
        yield name, exact_device


def render(rows):
    lines = [
        "// Generated at build time by flagos_core/codegen/gen_op_table.py. Do not edit.",
        '#include "core/OpTable.h"',
        "",
        "namespace flagos::generated {",
        "",
        "const OpTableRow kOpTable[] = {",
    ]
    for name, exact_device in rows:
        lines.append(f'    {{"{name}", {str(exact_device).lower()}}},')
    lines += [
        "};",
        "",
        "const size_t kOpTableSize = sizeof(kOpTable) / sizeof(kOpTable[0]);",
        "",
        "} // namespace flagos::generated",
        "",
    ]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output")
    args = parser.parse_args()
    text = render(sorted(routable_overloads()))
    # Rewrite only on change so an unchanged torch does not trigger a rebuild.
    if os.path.exists(args.output) and open(args.output).read() == text:
        return
    with open(args.output, "w") as out:
        out.write(text)


if __name__ == "__main__":
    main()
