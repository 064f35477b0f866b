#include "core/RelabelCall.h"

#include "core/Alias.h"

#include <string>
#include <unordered_map>

namespace flagos::detail {

namespace {

// Whether `storage` is a non-flagos argument's (so not the kernel's own).
bool isForeign(const c10::StorageImpl* storage, c10::ArrayRef<const c10::StorageImpl*> foreign) {
  for (const auto* s : foreign) {
    if (s == storage) {
      return true;
    }
  }
  return false;
}

// How many aliases a call's later tensor argument is compared with to find
// a repeated tensor: a few plain arguments, never a foreach call's lists.
constexpr size_t kSameTensorScan = 8;

} // namespace

// An argument that is a CPU tensor on every device, natively too: one the
// schema names `cpu_...` (`_nested_from_padded`'s cpu_nested_shape_example),
// and the targets of cuDNN's CTC loss: with lengths as lists its kernel
// reads them on the host; with lengths as tensors it moves CPU ones to the
// GPU itself (native CUDA computes that form).
static bool onCpuByDesign(const c10::OperatorHandle& op, size_t arg, const c10::Device& d) {
  if (!d.is_cpu()) {
    return false;
  }
  const std::string& name = op.schema().arguments().at(arg).name();
  if (name.rfind("cpu_", 0) == 0) {
    return true;
  }
  const std::string& base = op.operator_name().name;
  return name == "targets" && (base == "aten::_cudnn_ctc_loss" || base == "aten::_use_cudnn_ctc_loss");
}

// Whether the schema writes argument `arg` (in-place self, out=).
C10_NOINLINE static bool writesArgument(const c10::OperatorHandle& op, size_t arg) {
  const auto& args = op.schema().arguments();
  const c10::AliasInfo* alias = arg < args.size() ? args[arg].alias_info() : nullptr;
  return alias != nullptr && alias->isWrite();
}

namespace {

// A foreach op's lists pair tensors index by index, each pair as one
// tensor op would take it: natively a CPU tensor beside a device tensor
// raises there (CUDA's per-tensor path), unless it is a scalar read. The
// CPU kernel flagos runs would take it, and write it.
bool isForeach(const c10::OperatorHandle& op) {
  return op.operator_name().name.rfind("aten::_foreach_", 0) == 0;
}

} // namespace

bool foreignTensorAllowed(const c10::OperatorHandle& op, size_t arg, const at::Tensor& t, bool in_list, bool exact_device) {
  const c10::Device d = t.device();
  // A CPU scalar may be read, as native kernels read one; never written:
  // the kernel would write the CPU tensor (native ones refuse it).
  const bool scalar = t.dim() == 0 && d.is_cpu() && !writesArgument(op, arg);
  return scalar || (in_list && !exact_device && !isForeach(op)) || onCpuByDesign(op, arg, d);
}

void mixedDevices(const c10::Device& a, const c10::Device& b, const c10::OperatorHandle& op, size_t arg) {
  mixedDevices(a, b, op.schema().arguments().at(arg).name(), c10::toString(op.operator_name()));
}

void mixedDevices(const c10::Device& a, const c10::Device& b, const std::string& argument, const std::string& op) {
  TORCH_CHECK(
      false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ", b,
      "! (when checking argument for argument ", argument, " in method ", op, ")");
}

c10::DeviceIndex CallState::settleDeviceSlowly(c10::OptionalDeviceGuard& guard) {
  if (foreign && device) {
    mixedDevices(*device, foreign->first, op, foreign->second);
  }
  if (device && consts.single_device) {
    return device->index();
  }
  const c10::DeviceIndex current = rt.getDevice().index();
  if (device && device->index() != current) {
    guard.reset_device(*device);
  }
  return device ? device->index() : current;
}

CallState::~CallState() {
  if (C10_UNLIKELY(shared)) {
    restoreStorages(aliases.data(), aliases.size());
  }
  for (Alias& a : aliases) {
    recycleAlias(pool, std::move(a.pooled), a.native_storage);
  }
}

c10::MaybeOwned<at::Tensor> CallState::toAlias(const at::Tensor& t, size_t arg, bool in_list) {
  if (!t.defined()) {
    return c10::MaybeOwned<at::Tensor>::borrowed(t);
  }
  const c10::Device d = t.device();
  if (d.type() != c10::DeviceType::PrivateUse1) {
    foreign_storages.push_back(t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr);
    if (!foreign && !foreignTensorAllowed(op, arg, t, in_list, info.exact_device)) {
      foreign.emplace(d, arg);
    }
    return c10::MaybeOwned<at::Tensor>::borrowed(t);
  }
  noteDevice(d, arg);
  if (aliases.empty()) {
    pool = threadAliasPool(); // once per call: the first alias's lookup serves the rest
  } else if (!in_list && aliases.size() <= kSameTensorScan) {
    // One tensor in several arguments is one alias, as natively it is one
    // tensor: kernels test is_same (multi-head attention's fused input
    // projection, taken only for self-attention; TensorIterator's check
    // that an out= tensor which is also an input is not resized).
    for (Alias& a : aliases) {
      if (a.original == t.unsafeGetTensorImpl()) {
        a.args |= argumentBit(arg); // written back if either argument is written
        return c10::MaybeOwned<at::Tensor>::borrowed(a.pooled);
      }
    }
  }
  const c10::StorageImpl* made = nullptr;
  at::Tensor alias = pooledAlias(pool, t, consts.nativeDevice(d.index()), &made);
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  aliases.push_back(Alias{std::move(alias), impl, t.unsafeGetTensorImpl(), made, argumentBit(arg)});
  // A borrow copies the TensorImpl pointer, not a reference to the vector's
  // element, so it stays valid if `aliases` grows; the entry owns the alias.
  return c10::MaybeOwned<at::Tensor>::borrowed(aliases.back().pooled);
}

namespace {

const c10::StorageImpl* flagosStorageOf(const Alias& a) {
  return a.original->unsafe_storage().unsafeGetStorageImpl();
}

bool isWrittenAlias(const Alias& a, uint64_t written) {
  return (written & a.args) != 0;
}

// `to` takes `from`'s native storage for the call; its own waits in `displaced`.
void shareStorage(const Alias& from, Alias& to) {
  if (to.native->unsafe_storage().unsafeGetStorageImpl() == from.native->unsafe_storage().unsafeGetStorageImpl()) {
    return;
  }
  to.displaced = to.native->storage();
  to.native->set_storage_keep_dtype(from.native->storage());
}

} // namespace

bool shareWithWritten(Alias* aliases, size_t count, size_t written) {
  bool any = false;
  const c10::StorageImpl* storage = flagosStorageOf(aliases[written]);
  if (storage == nullptr) {
    return false;
  }
  for (size_t i = 0; i < count; ++i) {
    if (i != written && aliases[i].original != nullptr && flagosStorageOf(aliases[i]) == storage) {
      shareStorage(aliases[written], aliases[i]);
      any = true;
    }
  }
  return any;
}

namespace {

// Whether two of the aliases come from one flagos storage: pairwise for a
// few, else through an open-addressing set of storages (a call may pass
// hundreds of tensors, an optimizer's lists), on the stack up to 128.
bool anyStorageTwice(const Alias* aliases, size_t count) {
  if (count <= 8) {
    for (size_t i = 1; i < count; ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (flagosStorageOf(aliases[i]) == flagosStorageOf(aliases[j]) && flagosStorageOf(aliases[i]) != nullptr) {
          return true;
        }
      }
    }
    return false;
  }
  size_t slots = 32;
  while (slots < 2 * count) {
    slots *= 2;
  }
  c10::SmallVector<const c10::StorageImpl*, 256> seen(slots, nullptr);
  for (size_t i = 0; i < count; ++i) {
    const c10::StorageImpl* storage = flagosStorageOf(aliases[i]);
    for (size_t h = (reinterpret_cast<uintptr_t>(storage) >> 4) * 0x9E3779B97F4A7C15ull >> 40;; ++h) {
      const c10::StorageImpl*& slot = seen[h & (slots - 1)];
      if (slot == nullptr) {
        slot = storage;
        break;
      }
      if (slot == storage) {
        return true;
      }
    }
  }
  return false;
}

} // namespace

bool shareStorages(Alias* aliases, size_t count, uint64_t written) {
  if (C10_LIKELY(!anyStorageTwice(aliases, count))) {
    return false;
  }
  // Rare: group by storage (each storage's first alias, and whether any of
  // its aliases is written), then share within the groups that are written.
  struct Group {
    size_t first;
    bool written;
  };
  std::unordered_map<const c10::StorageImpl*, Group> groups;
  for (size_t i = 0; i < count; ++i) {
    if (flagosStorageOf(aliases[i]) == nullptr) {
      continue;
    }
    auto it = groups.try_emplace(flagosStorageOf(aliases[i]), Group{i, false}).first;
    it->second.written = it->second.written || isWrittenAlias(aliases[i], written);
  }
  bool any = false;
  for (size_t i = 0; i < count; ++i) {
    auto found = groups.find(flagosStorageOf(aliases[i]));
    if (found == groups.end()) {
      continue;
    }
    const Group& g = found->second;
    if (g.written && g.first != i) {
      shareStorage(aliases[g.first], aliases[i]);
      any = true;
    }
  }
  return any;
}

void restoreStorages(Alias* aliases, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    Alias& a = aliases[i];
    if (a.displaced) {
      c10::Storage own = std::move(a.displaced);
      a.displaced = c10::Storage();
      if (a.native->unsafe_storage().unsafeGetStorageImpl() != own.unsafeGetStorageImpl() &&
          a.native->unsafe_storage().data_ptr().get_context() == own.data_ptr().get_context()) {
        a.native->set_storage_keep_dtype(std::move(own));
      }
    }
  }
}

void carryOverChange(const Alias& a, c10::DeviceIndex index, c10::ArrayRef<const c10::StorageImpl*> foreign) {
  c10::TensorImpl* orig = a.original;
  const c10::TensorImpl* native = a.native;
  const c10::Storage& native_storage = native->unsafe_storage();
  c10::StorageImpl* orig_storage = orig->unsafe_storage().unsafeGetStorageImpl();
  if (isAliasOf(native_storage.unsafeGetStorageImpl()->data_ptr(), orig_storage)) {
    // Same memory, new geometry: below.
  } else if (auto flagos = aliasedFlagosStorage(native_storage)) {
    orig->set_storage_keep_dtype(*flagos); // set_ onto another flagos tensor
  } else if (native_storage.unsafeGetStorageImpl() == a.native_storage) {
    // Resized in place: the flagos storage takes the new memory, so every
    // flagos view of it sees the change, as with a native resize.
    takeGrownMemory(orig_storage, native_storage.unsafeGetStorageImpl());
  } else {
    orig->set_storage_keep_dtype(
        flagosStorageFor(native_storage, index, !isForeign(native_storage.unsafeGetStorageImpl(), foreign)));
  }
  if (!sameGeometry(*native, *orig)) {
    orig->set_sizes_and_strides(native->sizes(), native->strides(), native->storage_offset());
  }
}

at::Tensor CallState::fromNative(at::Tensor t, c10::DeviceIndex index) {
  // The common case first: a tensor this kernel made, held by nobody else.
  // An argument's alias, a view of one and an alias storage are all held by
  // this call as well, so none of them passes this test.
  if (t.defined() && t.device().type() != c10::DeviceType::PrivateUse1 && relabelIfSoleOwner(t, index)) {
    return t;
  }
  return adoptSharedResult(std::move(t), index, aliases, foreign_storages, op);
}

at::Tensor adoptSharedResult(
    at::Tensor t,
    c10::DeviceIndex index,
    c10::ArrayRef<Alias> aliases,
    c10::ArrayRef<const c10::StorageImpl*> foreign,
    const c10::OperatorHandle& op) {
  if (!t.defined() || t.device().type() == c10::DeviceType::PrivateUse1) {
    return t;
  }
  for (const Alias& a : aliases) {
    if (a.native == t.unsafeGetTensorImpl()) {
      // in-place and out= ops hand back their argument
      return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim_copy(a.original));
    }
  }
  TORCH_CHECK(
      t.layout() == c10::kStrided && t.has_storage(), "flagos: ", op.operator_name(), " returned a ", t.layout(),
      " tensor, and flagos holds strided (dense) tensors only. Make such tensors on the CPU (.cpu() first)");
  checkNotQuantized(*t.unsafeGetTensorImpl());
  const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  for (const Alias& a : aliases) {
    if (a.native_storage == storage) {
      return flagosTensorOver(a.original->storage(), t); // a view of an input
    }
  }
  if (auto flagos = aliasedFlagosStorage(t.storage())) {
    return flagosTensorOver(*flagos, t);
  }
  return flagosTensorOver(flagosStorageFor(t.storage(), index, !isForeign(storage, foreign)), t);
}

} // namespace flagos::detail
