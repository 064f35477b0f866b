#pragma once

// The router's per-call entry, for the kernels registered per overload (the
// boxed slot kernels in Router.cpp and the generated typed kernels).

#include <flagos/Provider.h>

#include <string>

namespace flagos::detail {

struct SlotCall {
  KernelProvider* provider;
  const c10::OperatorHandle* op;
  OpSlotInfo info;
};

// The provider serving slot `index` (resolving it on first use), with the
// call counted for trace() and logged under FLAGOS_LOG_DISPATCH.
SlotCall enterSlot(size_t index);

// A boxed kernel that hands a call on slot `index` to its provider without
// counting it again (typed kernels use it for providers that are not relabel
// providers).
c10::BoxedKernel providerBoxedKernel(size_t index);

// The relabel provider unrouted overloads go to (the active runtime's native
// one), or nullptr: for the core's own kernels that call a native kernel
// outside the router (convolution), so they run it inside its NativeScope.
RelabelProvider* defaultRelabelProvider();

// Whether the composite ops of WholeKernel.h may run whole on the native
// device: the default provider relabels for it, and no route sends an
// overload the native device can run to another provider.
bool wholeCallsOn();

// The arguments `schema` writes (in-place, out=): bit i for argument i, the
// first 64 (CallState::writeBackWritten checks any later one anyway).
uint64_t writtenArguments(const c10::FunctionSchema& schema);

// Why cpu_fallback cannot serve `op` although the CPU has a kernel for it, or
// "" where it can. It copies tensors to the CPU and back: a view would come
// back a copy, and an op that changes a tensor's storage or geometry in place
// (resize_, set_, transpose_) would change the copy (resize_ through it
// recursed until the stack overflowed).
std::string cpuFallbackRefusal(const c10::OperatorHandle& op);

} // namespace flagos::detail
