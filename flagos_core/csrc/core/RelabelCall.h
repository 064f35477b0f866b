#pragma once

// One relabelled call's bookkeeping (internal to the core), shared by the
// boxed path (Relabel.cpp) and the typed kernels (TypedKernel.h): which
// native aliases stand for which flagos tensors, which device the call is on,
// and how results come back as flagos tensors.

#include "core/Alias.h"
#include "core/CallConstants.h"

#include <flagos/Provider.h>
#include <flagos/Runtime.h>

#include <c10/core/DeviceGuard.h>
#include <c10/util/MaybeOwned.h>
#include <c10/util/SmallVector.h>

#include <optional>
#include <string>
#include <utility>

namespace flagos {

namespace detail {

class AliasPool;

struct Alias {
  // This call's own alias, from the pool and back to it after the call.
  at::Tensor pooled;
  c10::TensorImpl* native; // the alias the kernel sees
  // Borrowed: the caller's flagos tensor, alive for the whole call. Taking a
  // reference would cost, for a tensor Python holds, a trip through the GIL.
  c10::TensorImpl* original;
  const c10::StorageImpl* native_storage; // as made, before the kernel ran
  // The arguments it stands for (bit i: argument i in the schema; past the
  // 64th, every bit): one tensor passed twice is one alias.
  uint64_t args;
  // The alias's own storage while it uses another alias's (shareStorages).
  c10::Storage displaced;
};

// Alias::args's bit for argument `arg`.
inline uint64_t argumentBit(size_t arg) {
  return arg < 64 ? uint64_t{1} << arg : ~uint64_t{0};
}

// Where a call's flagos tensors share a storage, their aliases share one
// native storage for the call (each pooled alias has its own otherwise), so
// the native kernel sees what it would natively: its overlap checks raise for
// an output that overlaps an input, is_alias_of holds. Only calls that write
// need it; `written` (bit i: argument i; arguments past the 64th always)
// says which aliases are written: in a group with none, nothing changes.
// Returns whether any alias now uses another's storage.
bool shareStorages(Alias* aliases, size_t count, uint64_t written);
// The same for one written alias against the others (the short path).
bool shareWithWritten(Alias* aliases, size_t count, size_t written);
// Before recycling: each alias gets its own storage back, unless the kernel
// re-pointed it meanwhile.
void restoreStorages(Alias* aliases, size_t count);

// A native result that a kernel did not make for this call alone, as a
// flagos tensor: an argument handed back (its original), a view of one (over
// the original's storage), a view of an alias storage, or memory wrapped
// (taken over if it is not a non-flagos argument's, `foreign`). The sole-owner
// case (relabelIfSoleOwner) comes first, at the caller.
at::Tensor adoptSharedResult(
    at::Tensor t,
    c10::DeviceIndex index,
    c10::ArrayRef<Alias> aliases,
    c10::ArrayRef<const c10::StorageImpl*> foreign,
    const c10::OperatorHandle& op);

// writeBack's work once the alias did change: a resize or re-pointing
// carried over to the flagos tensor.
void carryOverChange(const Alias& a, c10::DeviceIndex index, c10::ArrayRef<const c10::StorageImpl*> foreign);

// After a kernel wrote through alias `a` (in-place, out=): nothing to do in
// the commonest case, a write in place; else a resize or re-pointing of the
// alias goes over to its flagos tensor. `foreign`: the call's non-flagos
// arguments' storages (never the kernel's own).
inline void writeBack(const Alias& a, c10::DeviceIndex index, c10::ArrayRef<const c10::StorageImpl*> foreign) {
  if (C10_UNLIKELY(!aliasUnchanged(*a.native, *a.original))) {
    carryOverChange(a, index, foreign);
  }
}

// PyTorch's error for tensors of two devices in one call, naming the
// argument found on the second and the op. `arg`: the argument's index in
// op's schema (read only to name it here).
[[noreturn]] void mixedDevices(const c10::Device& a, const c10::Device& b, const c10::OperatorHandle& op, size_t arg);
[[noreturn]] void mixedDevices(const c10::Device& a, const c10::Device& b, const std::string& argument, const std::string& op);

// Whether a non-flagos tensor in argument `arg` of a call on a flagos device
// is allowed there, as natively it is: a CPU scalar that is read, a tensor
// in a list of an op that does not demand one device, or an argument that
// is a CPU tensor by design. `exact_device`: the op's device_check.
bool foreignTensorAllowed(const c10::OperatorHandle& op, size_t arg, const at::Tensor& t, bool in_list, bool exact_device);

struct CallState {
  const c10::OperatorHandle& op;
  const OpSlotInfo& info;
  const CallConstants& consts;
  DeviceRuntime& rt;
  std::optional<c10::Device> device; // the flagos device of the call
  std::optional<std::pair<c10::Device, size_t>> foreign; // first non-flagos tensor, and its argument
  c10::SmallVector<Alias, 4> aliases;
  AliasPool* pool = nullptr; // this thread's, looked up with the first alias
  c10::SmallVector<const c10::StorageImpl*, 4> foreign_storages;
  c10::SmallVector<at::Tensor, 2> kept; // originals nobody else holds for the call
  bool shared = false; // some alias uses another's storage (shareStorages)

  CallState(const c10::OperatorHandle& op, const OpSlotInfo& info, const CallConstants& consts)
      : op(op), info(info), consts(consts), rt(*consts.runtime) {}
  CallState(const CallState&) = delete;
  CallState& operator=(const CallState&) = delete;
  ~CallState(); // aliases back to the pool

  void noteDevice(const c10::Device& d, size_t arg) {
    if (!device) {
      device = d;
    } else if (*device != d) {
      mixedDevices(*device, d, op, arg);
    }
  }

  // The native alias to pass for argument `arg` (its index in the schema; a
  // non-flagos tensor as it is), borrowed for the call. In a list (indices and the like), CPU tensors
  // are allowed unless the op demands one device, as with the native
  // backends. `t` must outlive the call (an argument the caller holds); where
  // it may not (a boxed stack slot the alias replaces, an element copied out
  // of a list), toAliasKept holds it for the call.
  c10::MaybeOwned<at::Tensor> toAlias(const at::Tensor& t, size_t arg, bool in_list);
  c10::MaybeOwned<at::Tensor> toAliasKept(at::Tensor t, size_t arg, bool in_list) {
    kept.push_back(std::move(t));
    return toAlias(kept.back(), arg, in_list);
  }

  // After the arguments: raises for a flagos/other-device mix, makes the
  // call's device current through `guard` if it is not, and returns the
  // device index the call runs on.
  c10::DeviceIndex settleDevice(c10::OptionalDeviceGuard& guard) {
    if (C10_LIKELY(device && !foreign && consts.single_device)) {
      return device->index(); // the only device is the current one: no query
    }
    return settleDeviceSlowly(guard);
  }

  // Once the arguments are converted, for a call that writes.
  void shareStorages(uint64_t written) {
    if (aliases.size() > 1) {
      shared = detail::shareStorages(aliases.data(), aliases.size(), written);
    }
  }

  // For written arguments (in-place, out=): carry a resize or re-pointing
  // of an alias over to its flagos tensor.
  void writeBackAll(c10::DeviceIndex index) {
    for (const Alias& a : aliases) {
      writeBack(a, index, foreign_storages);
    }
  }
  // The same for the arguments whose bits are set in `written` (bit i:
  // argument i; arguments past the 64th always): a kernel writes only the
  // arguments its schema marks, so the read ones need no check.
  void writeBackWritten(c10::DeviceIndex index, uint64_t written) {
    for (const Alias& a : aliases) {
      if ((written & a.args) != 0) {
        writeBack(a, index, foreign_storages);
      }
    }
  }

  // A native result as a flagos tensor: the argument it is, a view of an
  // argument's storage, or fresh memory relabelled.
  at::Tensor fromNative(at::Tensor t, c10::DeviceIndex index);

 private:
  c10::DeviceIndex settleDeviceSlowly(c10::OptionalDeviceGuard& guard);
};

} // namespace detail
} // namespace flagos
