#include <flagos/Relabel.h>

#include <c10/core/DeviceGuard.h>
#include <c10/util/SmallVector.h>

namespace flagos {
namespace {

// The alias storage's DataPtr holds a reference on the flagos StorageImpl, so
// the memory outlives anything a native kernel keeps of the alias.
void releaseFlagosStorage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

bool isAliasDataPtr(const c10::DataPtr& ptr) {
  return ptr.get_deleter() == &releaseFlagosStorage;
}

c10::Storage nativeStorageFor(c10::StorageImpl* flagos, c10::Device native) {
  c10::raw::intrusive_ptr::incref(flagos);
  c10::DataPtr ptr(flagos->mutable_data_ptr().get(), flagos, &releaseFlagosStorage, native);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), flagos->sym_nbytes(), std::move(ptr),
      c10::GetAllocator(native.type()), flagos->resizable()));
}

c10::DispatchKeySet keysFor(c10::Device device) {
  return c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, c10::kStrided, device));
}

void copyGeometry(const c10::TensorImpl& from, c10::TensorImpl& to) {
  to.set_sizes_and_strides(from.sizes(), from.strides(), from.storage_offset());
  if (from.is_conj()) {
    to._set_conj(true);
  }
  if (from.is_neg()) {
    to._set_neg(true);
  }
}

// Owns a native storage on behalf of a flagos DataPtr over the same memory.
struct ForeignStorageRef {
  c10::Storage storage;
};

void deleteForeignStorageRef(void* ctx) {
  delete static_cast<ForeignStorageRef*>(ctx);
}

// A flagos-labelled storage over `native`'s memory. Relabels in place when the
// storage is fresh (made by the kernel we just ran, so nobody else sees it),
// else wraps it so the original keeps its label.
c10::Storage flagosStorageFor(const c10::Storage& native, c10::DeviceIndex index, bool fresh) {
  const c10::Device label(c10::DeviceType::PrivateUse1, index);
  c10::StorageImpl* impl = native.unsafeGetStorageImpl();
  if (impl->data_ptr().device().type() == c10::DeviceType::PrivateUse1) {
    return native;
  }
  if (fresh) {
    impl->mutable_data_ptr().unsafe_set_device(label);
    impl->set_allocator(activeRuntime().allocator());
    return native;
  }
  void* data = impl->mutable_data_ptr().get();
  c10::DataPtr wrapped(data, new ForeignStorageRef{native}, &deleteForeignStorageRef, label);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->sym_nbytes(), std::move(wrapped), nullptr, false));
}

at::Tensor flagosTensorOver(c10::Storage storage, const at::Tensor& geometry) {
  const c10::DispatchKeySet keys = keysFor(storage.device());
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys, geometry.dtype());
  copyGeometry(*geometry.unsafeGetTensorImpl(), *impl);
  return at::Tensor(std::move(impl));
}

[[noreturn]] void mixedDevices(
    const c10::Device& a,
    const c10::Device& b,
    const c10::OperatorHandle& op,
    const c10::Argument& arg) {
  TORCH_CHECK(
      false, "Expected all tensors to be on the same device, but found at least two devices, ", a, " and ", b,
      "! (when checking argument for argument ", arg.name(), " in method ", op.operator_name(), ")");
}

struct Alias {
  at::Tensor native;
  at::Tensor original;
  const c10::StorageImpl* native_storage; // as made, before the kernel ran
};

// The flagos storage whose memory an alias storage points at, if it is one.
std::optional<c10::Storage> aliasedFlagosStorage(const c10::Storage& native) {
  const c10::DataPtr& ptr = native.unsafeGetStorageImpl()->data_ptr();
  if (!isAliasDataPtr(ptr)) {
    return std::nullopt;
  }
  auto* flagos = static_cast<c10::StorageImpl*>(ptr.get_context());
  return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(flagos));
}

// Per-call bookkeeping: which aliases stand for which flagos tensors.
struct CallState {
  const c10::OperatorHandle& op;
  const OpSlotInfo& info;
  DeviceRuntime& rt;
  std::optional<c10::Device> device; // the flagos device of the call
  std::optional<std::pair<c10::Device, const c10::Argument*>> foreign; // first non-flagos tensor
  c10::SmallVector<Alias, 4> aliases;
  c10::SmallVector<const c10::StorageImpl*, 4> foreign_storages;

  void noteDevice(const c10::Device& d, const c10::Argument& arg) {
    if (!device) {
      device = d;
    } else if (*device != d) {
      mixedDevices(*device, d, op, arg);
    }
  }

  // In a list (indices and the like), CPU tensors are allowed unless the op
  // demands one device, as with the native backends.
  at::Tensor toAlias(const at::Tensor& t, const c10::Argument& arg, bool in_list) {
    if (!t.defined()) {
      return t;
    }
    if (t.device().type() != c10::DeviceType::PrivateUse1) {
      foreign_storages.push_back(t.has_storage() ? t.storage().unsafeGetStorageImpl() : nullptr);
      const bool scalar = t.dim() == 0 && t.device().is_cpu();
      if (!scalar && (!in_list || info.exact_device) && !foreign) {
        foreign.emplace(t.device(), &arg);
      }
      return t;
    }
    noteDevice(t.device(), arg);
    at::Tensor alias = toNative(t, rt.nativeDevice(t.device().index()));
    const c10::StorageImpl* storage = alias.storage().unsafeGetStorageImpl();
    aliases.push_back(Alias{alias, t, storage});
    return alias;
  }

  // A writable argument whose alias the kernel resized or re-pointed: carry
  // the change over to the flagos tensor.
  void writeBack(const Alias& a, c10::DeviceIndex index) {
    c10::TensorImpl* orig = a.original.unsafeGetTensorImpl();
    const c10::TensorImpl* native = a.native.unsafeGetTensorImpl();
    const c10::Storage& native_storage = native->storage();
    c10::StorageImpl* orig_storage = orig->storage().unsafeGetStorageImpl();
    if (auto flagos = aliasedFlagosStorage(native_storage)) {
      if (flagos->unsafeGetStorageImpl() != orig_storage) {
        orig->set_storage_keep_dtype(*flagos); // set_ onto another flagos tensor
      }
    } else if (native_storage.unsafeGetStorageImpl() == a.native_storage) {
      // Resized in place: the flagos storage takes the new memory, so every
      // flagos view of it sees the change, as with a native resize.
      c10::StorageImpl* impl = native_storage.unsafeGetStorageImpl();
      c10::DataPtr ptr = std::move(impl->mutable_data_ptr());
      ptr.unsafe_set_device(c10::Device(c10::DeviceType::PrivateUse1, index));
      orig_storage->set_data_ptr_noswap(std::move(ptr));
      orig_storage->set_nbytes(impl->nbytes());
    } else {
      orig->set_storage_keep_dtype(flagosStorageFor(native_storage, index, isFresh(native_storage)));
    }
    if (native->sizes() != orig->sizes() || native->strides() != orig->strides() ||
        native->storage_offset() != orig->storage_offset()) {
      orig->set_sizes_and_strides(native->sizes(), native->strides(), native->storage_offset());
    }
  }

  bool isFresh(const c10::Storage& storage) const {
    for (const auto* s : foreign_storages) {
      if (s == storage.unsafeGetStorageImpl()) {
        return false;
      }
    }
    return true;
  }

  at::Tensor fromNative(const at::Tensor& t, c10::DeviceIndex index) {
    if (!t.defined() || t.device().type() == c10::DeviceType::PrivateUse1) {
      return t;
    }
    for (const Alias& a : aliases) {
      if (a.native.unsafeGetTensorImpl() == t.unsafeGetTensorImpl()) {
        return a.original; // in-place and out= ops hand back their argument
      }
    }
    TORCH_CHECK(
        t.layout() == c10::kStrided && t.has_storage(), "flagos: ", op.operator_name(), " returned a ", t.layout(),
        " tensor; flagos tensors are strided");
    const c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
    for (const Alias& a : aliases) {
      if (a.native_storage == storage) {
        return flagosTensorOver(a.original.storage(), t); // a view of an input
      }
    }
    if (auto flagos = aliasedFlagosStorage(t.storage())) {
      return flagosTensorOver(*flagos, t);
    }
    return flagosTensorOver(flagosStorageFor(t.storage(), index, isFresh(t.storage())), t);
  }
};

c10::IValue convertResult(c10::IValue value, CallState& state, c10::DeviceIndex index) {
  if (value.isTensor()) {
    return state.fromNative(value.toTensor(), index);
  }
  if (value.isTensorList()) {
    auto list = value.toTensorList();
    c10::List<at::Tensor> out;
    out.reserve(list.size());
    for (const at::Tensor& t : list) {
      out.push_back(state.fromNative(t, index));
    }
    return out;
  }
  return value;
}

} // namespace

at::Tensor toNative(const at::Tensor& t, c10::Device native) {
  const c10::TensorImpl* src = t.unsafeGetTensorImpl();
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      nativeStorageFor(src->storage().unsafeGetStorageImpl(), native), keysFor(native), t.dtype());
  copyGeometry(*src, *impl);
  return at::Tensor(std::move(impl));
}

at::Tensor nativeAliasOf(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) {
    return t;
  }
  return toNative(t, activeRuntime().nativeDevice(t.device().index()));
}

at::Tensor adoptNative(const at::Tensor& native, c10::DeviceIndex index) {
  return flagosTensorOver(flagosStorageFor(native.storage(), index, false), native);
}

bool RelabelProvider::canServe(const c10::OperatorHandle& op) const {
  return op.hasComputedKernelForDispatchKey(activeRuntime().nativeDispatchKey());
}

void RelabelProvider::runNative(const c10::OperatorHandle& op, Stack* stack, c10::DeviceIndex /*index*/) {
  op.redispatchBoxed(c10::DispatchKeySet(activeRuntime().nativeDispatchKey()), stack);
}

void RelabelProvider::call(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet /*keys*/,
    Stack* stack,
    const OpSlotInfo& info) {
  DeviceRuntime& rt = activeRuntime();
  if (info.metadata_only) {
    op.redispatchBoxed(c10::DispatchKeySet(rt.nativeDispatchKey()), stack);
    return;
  }
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t first = stack->size() - args.size();
  CallState state{op, info, rt};
  c10::SmallVector<size_t, 2> generator_args;
  c10::SmallVector<size_t, 2> device_args;

  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isTensor()) {
      v = state.toAlias(v.toTensor(), args[i], false);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> native;
      native.reserve(list.size());
      for (const at::Tensor& t : list) {
        native.push_back(state.toAlias(t, args[i], true));
      }
      v = std::move(native);
    } else if (v.isOptionalTensorList()) {
      auto list = v.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> native;
      native.reserve(list.size());
      for (const std::optional<at::Tensor>& t : list) {
        native.push_back(t.has_value() ? std::optional<at::Tensor>(state.toAlias(*t, args[i], true)) : std::nullopt);
      }
      v = std::move(native);
    } else if (v.isStorage() && v.toStorage().device().type() == c10::DeviceType::PrivateUse1) {
      const c10::Storage storage = v.toStorage();
      state.noteDevice(storage.device(), args[i]);
      v = nativeStorageFor(storage.unsafeGetStorageImpl(), rt.nativeDevice(storage.device().index()));
    } else if (v.isGenerator() || (info.takes_generator && v.isNone() && isOptionalGenerator(args[i]))) {
      generator_args.push_back(i);
    } else if (v.isDevice() && v.toDevice().type() == c10::DeviceType::PrivateUse1) {
      device_args.push_back(i);
    } else if (v.isStream() && v.toStream().device_type() == c10::DeviceType::PrivateUse1) {
      const c10::Stream s = v.toStream(); // flagos streams are the native ones, relabelled
      v = c10::Stream(c10::Stream::UNSAFE, rt.nativeDevice(s.device_index()), s.id());
    }
  }

  // Factory overloads carry the device as an argument instead of a tensor.
  for (size_t i : device_args) {
    c10::Device d = (*stack)[first + i].toDevice();
    if (!d.has_index()) {
      d = c10::Device(c10::DeviceType::PrivateUse1, rt.getDevice().index());
    }
    rt.checkIndex(d.index());
    state.noteDevice(d, args[i]);
    (*stack)[first + i] = rt.nativeDevice(d.index());
  }
  if (state.foreign && state.device) {
    mixedDevices(*state.device, state.foreign->first, op, *state.foreign->second);
  }
  const c10::DeviceIndex index = state.device ? state.device->index() : rt.getDevice().index();
  for (size_t i : generator_args) {
    c10::IValue& v = (*stack)[first + i];
    v = rt.nativeGenerator(v.isGenerator() ? v.toGenerator() : rt.defaultGenerator(index));
  }

  c10::OptionalDeviceGuard guard;
  if (state.device && state.device->index() != rt.getDevice().index()) {
    guard.reset_device(*state.device);
  }
  runNative(op, stack, index);

  if (info.writes) {
    for (const Alias& a : state.aliases) {
      state.writeBack(a, index);
    }
  }

  const size_t returns = schema.returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    (*stack)[i] = convertResult(std::move((*stack)[i]), state, index);
  }
}

} // namespace flagos
