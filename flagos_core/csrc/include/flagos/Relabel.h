#pragma once

// Zero-copy relabel: run a native device's kernel on a flagos tensor by
// viewing the same storage as a tensor of the native device type. Each call
// gets its own alias TensorImpls (from a per-thread pool), so tensors shared
// between threads are never relabelled in place.

#include <flagos/Provider.h>
#include <flagos/Runtime.h>

#include <c10/core/impl/LocalDispatchKeySet.h>

namespace flagos {

// The keys of a plain flagos tensor: dense, on flagos, with no Python
// subclass (FakeTensor), functionalization, conjugate or negative bit. Only
// such tensors may be relabelled wholesale; the core's whole calls and the
// kernels that take the native device's choice leave others to the composite.
inline c10::DispatchKeySet plainFlagosKeys() {
  static const c10::DispatchKeySet keys = c10::DispatchKeySet(c10::DispatchKey::PrivateUse1) |
      c10::getAutogradRelatedKeySetFromBackend(c10::BackendComponent::PrivateUse1Bit) |
      c10::getAutocastRelatedKeySetFromBackend(c10::BackendComponent::PrivateUse1Bit);
  return keys;
}

// Whether `t` is undefined, not a flagos tensor, or a plain flagos tensor:
// whether a native kernel may take it as it is or through an alias.
inline bool plainFlagosOrOther(const at::Tensor& t) {
  return !t.defined() || !t.is_privateuseone() || plainFlagosKeys().isSupersetOf(t.key_set());
}

// A native-device alias of a flagos tensor (same StorageImpl, same geometry).
FLAGOS_API at::Tensor toNative(const at::Tensor& flagos_tensor, c10::Device native);
// toNative for a flagos tensor on its device's native device; any other
// tensor (CPU, undefined) as it is.
FLAGOS_API at::Tensor nativeAliasOf(const at::Tensor& t);
// A flagos tensor over `native`'s memory on flagos:<index>, without copying.
FLAGOS_API at::Tensor adoptNative(const at::Tensor& native, c10::DeviceIndex index);
// adoptNative taking the tensor over: one that nothing else holds (a native
// kernel's fresh result, moved in) becomes the flagos tensor itself, as the
// core's own relabelled calls return theirs: no allocation, and resizable.
// Anything else is wrapped as by the overload above.
FLAGOS_API at::Tensor adoptNative(at::Tensor&& native, c10::DeviceIndex index);

namespace detail {
class AliasPool;
}

// The native alias of a flagos tensor for one scope, from the calling
// thread's pool (no allocation, unlike toNative); any other tensor (CPU,
// undefined) as it is. For a provider's call: `t` must outlive the scope. A
// kernel may keep the alias; it then holds the memory, as toNative's would.
class FLAGOS_API ScopedNativeAlias {
 public:
  explicit ScopedNativeAlias(const at::Tensor& t);
  ~ScopedNativeAlias();
  ScopedNativeAlias(const ScopedNativeAlias&) = delete;
  ScopedNativeAlias& operator=(const ScopedNativeAlias&) = delete;
  const at::Tensor& get() const {
    return made_ != nullptr ? alias_ : original_;
  }

 private:
  const at::Tensor& original_;
  detail::AliasPool* pool_ = nullptr;
  at::Tensor alias_;
  const c10::StorageImpl* made_ = nullptr;
};

// Serves every overload that has a kernel for the active runtime's native
// dispatch key: arguments as native aliases, the native kernel, results back
// as flagos tensors. Hot overloads reach it through typed kernels generated at
// build time, the rest boxed; both run the same steps, so `call` is final and
// a runtime customises only the bracket around the native kernel.
class FLAGOS_API RelabelProvider : public KernelProvider {
 public:
  explicit RelabelProvider(std::string name) : KernelProvider(std::move(name)) {
    relabel_ = this;
  }
  bool canServe(const c10::OperatorHandle& op) const override;
  void call(
      const c10::OperatorHandle& op,
      c10::DispatchKeySet keys,
      Stack* stack,
      const OpSlotInfo& info) final;

  // Around each native kernel, on the calling thread (the host runtime points
  // the CPU allocator at device memory meanwhile). enterNative's value is
  // handed to exitNative.
  virtual int64_t enterNative(c10::DeviceIndex /*index*/) {
    return 0;
  }
  virtual void exitNative(int64_t /*entered*/) {}
};

namespace detail {

// While a flagos call runs native kernels, the native device's autocast is
// off, so torch.autocast("cpu") (or "cuda") around flagos code casts
// nothing inside flagos's calls, as it casts no other device's tensors; on
// the host runtime it is flagos's (on, with flagos's dtype, where
// torch.autocast("flagos") is on for the call), so a native kernel that
// calls autocast-listed ops without being listed itself (the transformer
// fast path) casts them as natively. With autocast off everywhere (one
// thread-local read), nothing changes.
class FLAGOS_API NativeAutocast {
 public:
  NativeAutocast() {
    if (C10_UNLIKELY(!c10::impl::tls_local_dispatch_key_set().excluded_.isSupersetOf(c10::autocast_dispatch_keyset))) {
      enter();
    }
  }
  ~NativeAutocast() {
    if (C10_UNLIKELY(changed_)) {
      exit();
    }
  }
  NativeAutocast(const NativeAutocast&) = delete;
  NativeAutocast& operator=(const NativeAutocast&) = delete;

 private:
  void enter();
  void exit();
  bool changed_ = false;
  bool native_was_on_ = false;
  c10::DeviceType native_ = c10::DeviceType::CPU;
  at::ScalarType native_dtype_ = at::ScalarType::Undefined;
};

} // namespace detail

// enterNative / exitNative as a scope, with the native autocast mirrored.
class NativeScope {
 public:
  NativeScope(RelabelProvider& provider, c10::DeviceIndex index)
      : provider_(provider), entered_(provider.enterNative(index)) {}
  ~NativeScope() {
    provider_.exitNative(entered_);
  }
  NativeScope(const NativeScope&) = delete;
  NativeScope& operator=(const NativeScope&) = delete;

 private:
  RelabelProvider& provider_;
  int64_t entered_;
  detail::NativeAutocast autocast_;
};

} // namespace flagos
