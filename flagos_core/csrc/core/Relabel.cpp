#include <flagos/Relabel.h>

#include "core/Alias.h"
#include "core/CallConstants.h"
#include "core/RelabelCall.h"

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceGuard.h>

namespace flagos {
namespace {

using detail::CallState;

c10::IValue convertResult(c10::IValue value, CallState& state, c10::DeviceIndex index) {
  if (value.isTensor()) {
    return state.fromNative(std::move(value).toTensor(), index);
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

void detail::NativeAutocast::enter() {
  const c10::DeviceType native = activeRuntime().nativeDeviceType();
  // Switched on only where the native device is the CPU (the host runtime):
  // torch's transformer layers check CUDA's autocast alone before taking
  // their fast path, so native CUDA never runs that kernel under autocast,
  // and CUDA's kernel fails on the mixed dtypes its inner casts give.
  const bool on = at::autocast::is_autocast_enabled(c10::DeviceType::PrivateUse1) && native == c10::DeviceType::CPU;
  const bool native_on = at::autocast::is_autocast_enabled(native);
  const at::ScalarType dtype = at::autocast::get_autocast_dtype(c10::DeviceType::PrivateUse1);
  const at::ScalarType native_dtype = at::autocast::get_autocast_dtype(native);
  if (on == native_on && (!on || dtype == native_dtype)) {
    return;
  }
  changed_ = true;
  native_ = native;
  native_was_on_ = native_on;
  native_dtype_ = native_dtype;
  at::autocast::set_autocast_enabled(native, on);
  if (on) {
    at::autocast::set_autocast_dtype(native, dtype);
  }
}

void detail::NativeAutocast::exit() {
  at::autocast::set_autocast_enabled(native_, native_was_on_);
  at::autocast::set_autocast_dtype(native_, native_dtype_);
}

at::Tensor toNative(const at::Tensor& t, c10::Device native) {
  const c10::TensorImpl* src = t.unsafeGetTensorImpl();
  auto impl = c10::make_intrusive<c10::TensorImpl>(
      detail::exportedStorage(src->storage().unsafeGetStorageImpl(), native), detail::keysFor(native), t.dtype());
  detail::copyGeometry(*src, *impl);
  return at::Tensor(std::move(impl));
}

at::Tensor nativeAliasOf(const at::Tensor& t) {
  if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) {
    return t;
  }
  return toNative(t, activeRuntime().nativeDevice(t.device().index()));
}

at::Tensor adoptNative(const at::Tensor& native, c10::DeviceIndex index) {
  return detail::flagosTensorOver(detail::flagosStorageFor(native.storage(), index, false), native);
}

at::Tensor adoptNative(at::Tensor&& native, c10::DeviceIndex index) {
  if (native.defined() && native.device().type() != c10::DeviceType::PrivateUse1 &&
      detail::relabelIfSoleOwner(native, index)) {
    return std::move(native);
  }
  return adoptNative(static_cast<const at::Tensor&>(native), index);
}

ScopedNativeAlias::ScopedNativeAlias(const at::Tensor& t) : original_(t) {
  if (t.defined() && t.device().type() == c10::DeviceType::PrivateUse1) {
    pool_ = detail::threadAliasPool();
    alias_ = detail::pooledAlias(pool_, t, detail::callConstants().nativeDevice(t.device().index()), &made_);
  }
}

ScopedNativeAlias::~ScopedNativeAlias() {
  detail::recycleAlias(pool_, std::move(alias_), made_);
}

bool RelabelProvider::canServe(const c10::OperatorHandle& op) const {
  return op.hasComputedKernelForDispatchKey(activeRuntime().nativeDispatchKey());
}

namespace {

// PyTorch's own refusal (checkSetStorage), naming the flagos tensor's
// device (its argument comes first, so is noted already).
[[noreturn]] C10_NOINLINE void refuseForeignStorage(const detail::CallState& state, const c10::Storage& storage) {
  const c10::Device self = state.device.value_or(c10::Device(c10::DeviceType::PrivateUse1, 0));
  TORCH_CHECK(
      false, "Attempted to set the storage of a tensor on device \"", self, "\" to a storage on different device \"",
      storage.device(), "\".  This is no longer allowed; the devices must match.");
}

// A generator must be of the call's device, as native kernels demand of
// theirs (PyTorch's "Expected a 'cuda' device type for generator"). A CPU
// one given to a flagos call would draw the CPU's numbers on the host
// runtime, and reach a CUDA kernel on a GPU; a flagos one brings a call on
// CPU tensors here by its dispatch key alone.
C10_NOINLINE void checkGenerator(const detail::CallState& state, const at::Generator& gen) {
  const c10::DeviceType expected = state.device ? c10::DeviceType::PrivateUse1
      : state.foreign                            ? state.foreign->first.type()
                                                 : c10::DeviceType::CPU;
  TORCH_CHECK(
      gen.device().type() == expected, "Expected a '", c10::DeviceTypeName(expected, true),
      "' device type for generator but found '", c10::DeviceTypeName(gen.device().type(), true), "'");
}

} // namespace

// The boxed path; TypedKernel.h runs the same steps on typed arguments.
void RelabelProvider::call(
    const c10::OperatorHandle& op,
    c10::DispatchKeySet /*keys*/,
    Stack* stack,
    const OpSlotInfo& info) {
  const detail::CallConstants& c = detail::callConstants();
  DeviceRuntime& rt = *c.runtime;
  if (info.metadata_only) {
    op.redispatchBoxed(c.native_keys, stack);
    return;
  }
  const auto& schema = op.schema();
  const auto& args = schema.arguments();
  const size_t first = stack->size() - args.size();
  CallState state(op, info, c);
  c10::SmallVector<size_t, 2> generator_args;
  c10::SmallVector<size_t, 2> device_args;
  // Storage arguments (set_) and their native stand-ins, which the kernel
  // may grow, as set_ grows a storage too small for the sizes it is given.
  c10::SmallVector<std::pair<c10::StorageImpl*, c10::Storage>, 1> storage_args;

  for (size_t i = 0; i < args.size(); ++i) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isTensor()) {
      v = *state.toAliasKept(std::move(v).toTensor(), i, false);
    } else if (v.isTensorList()) {
      auto list = v.toTensorList();
      c10::List<at::Tensor> native;
      native.reserve(list.size());
      for (const at::Tensor& t : list) {
        native.push_back(*state.toAliasKept(t, i, true));
      }
      v = std::move(native);
    } else if (v.isOptionalTensorList()) {
      auto list = v.toOptionalTensorList();
      c10::List<std::optional<at::Tensor>> native;
      native.reserve(list.size());
      for (const std::optional<at::Tensor>& t : list) {
        native.push_back(t.has_value() ? std::optional<at::Tensor>(*state.toAliasKept(*t, i, true)) : std::nullopt);
      }
      v = std::move(native);
    } else if (v.isStorage() && v.toStorage().device().type() == c10::DeviceType::PrivateUse1) {
      const c10::Storage storage = v.toStorage();
      state.noteDevice(storage.device(), i);
      v = detail::nativeStorageFor(storage.unsafeGetStorageImpl(), rt.nativeDevice(storage.device().index()), true);
      storage_args.emplace_back(storage.unsafeGetStorageImpl(), v.toStorage());
    } else if (v.isStorage()) {
      // set_ onto another device's storage: the native kernel would see its
      // own device on both sides (the alias) and take it, relabelling that
      // device's memory as flagos's under its owner.
      refuseForeignStorage(state, v.toStorage());
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
  if (info.writes) {
    state.shareStorages(~uint64_t{0}); // any group of aliases with one storage, in a call that writes
  }
  for (size_t i : device_args) {
    c10::Device d = (*stack)[first + i].toDevice();
    if (!d.has_index()) {
      d = c10::Device(c10::DeviceType::PrivateUse1, rt.getDevice().index());
    }
    rt.checkIndex(d.index());
    state.noteDevice(d, i);
    (*stack)[first + i] = rt.nativeDevice(d.index());
  }
  c10::OptionalDeviceGuard guard;
  const c10::DeviceIndex index = state.settleDevice(guard);
  for (size_t i : generator_args) {
    c10::IValue& v = (*stack)[first + i];
    if (v.isGenerator()) {
      checkGenerator(state, v.toGenerator());
    }
    v = rt.nativeGenerator(v.isGenerator() ? v.toGenerator() : rt.defaultGenerator(index));
  }
  // An operator outside ATen that writes its arguments (a torch.library
  // op) has no ADInplaceOrView kernel: natively its tensors' versions move
  // with the writes its kernel makes inside, which here reach the aliases.
  // They are carried over, so autograd still catches a saved tensor written.
  c10::SmallVector<uint32_t, 4> versions;
  const bool carries_versions = info.writes && op.operator_name().name.rfind("aten::", 0) != 0;
  if (carries_versions) {
    for (const detail::Alias& a : state.aliases) {
      versions.push_back(a.native->version_counter().enabled() ? a.native->version_counter().current_version() : 0);
    }
  }
  {
    NativeScope scope(*this, index);
    op.redispatchBoxed(c.native_keys, stack);
  }
  if (carries_versions) {
    for (size_t i = 0; i < versions.size(); ++i) {
      const detail::Alias& a = state.aliases[i];
      if (a.native->version_counter().enabled()) {
        for (uint32_t v = versions[i]; v < a.native->version_counter().current_version(); ++v) {
          a.original->bump_version();
        }
      }
    }
  }

  for (auto& [flagos, native] : storage_args) {
    detail::keepExportOver(flagos, native.unsafeGetStorageImpl()); // first: the written tensors may be over it
  }
  if (info.writes) {
    state.writeBackAll(index);
  }

  const size_t returns = schema.returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    (*stack)[i] = convertResult(std::move((*stack)[i]), state, index);
  }
}

} // namespace flagos
