#pragma once

// Typed (unboxed) router kernels, instantiated by the generated
// TypedKernels*.cpp for hot overloads. Same steps as RelabelProvider::call
// (Relabel.cpp), on the C++ arguments: no IValue stack, no boxing of lists.
// Overloads with Generator, Device, Stream or Storage arguments stay boxed
// (the generator filters them out).

#include "core/Alias.h"
#include "core/RelabelCall.h"
#include "core/RouterInternal.h"

#include <flagos/Relabel.h>

#include <ATen/core/boxing/KernelFunction.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/as_strided_ops.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/view_ops.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#include <array>
#include <new>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace flagos::typed {

using detail::CallState;

// How one argument type crosses to the native device. Plain values pass as
// they are (a reference stays a reference).
template <class T>
struct Arg {
  static_assert(
      !std::is_same_v<std::decay_t<T>, at::Generator> && !std::is_same_v<std::decay_t<T>, std::optional<at::Generator>> &&
          !std::is_same_v<std::decay_t<T>, c10::Device> && !std::is_same_v<std::decay_t<T>, std::optional<c10::Device>> &&
          !std::is_same_v<std::decay_t<T>, c10::Stream> && !std::is_same_v<std::decay_t<T>, c10::Storage>,
      "flagos: this argument type needs the boxed path");
  using Held = T;
  static T convert(CallState&, T v, size_t) {
    return static_cast<T>(v);
  }
  static T pass(Held& h) {
    return static_cast<T>(h);
  }
};

template <>
struct Arg<const at::Tensor&> {
  using Held = c10::MaybeOwned<at::Tensor>;
  static Held convert(CallState& s, const at::Tensor& t, size_t a) {
    return s.toAlias(t, a, false);
  }
  static const at::Tensor& pass(Held& h) {
    return *h;
  }
};

template <>
struct Arg<at::Tensor&> {
  using Held = c10::MaybeOwned<at::Tensor>;
  static Held convert(CallState& s, const at::Tensor& t, size_t a) {
    return s.toAlias(t, a, false);
  }
  static at::Tensor& pass(Held& h) {
    return const_cast<at::Tensor&>(*h); // a pooled alias the core owns for the call
  }
};

template <>
struct Arg<const std::optional<at::Tensor>&> {
  using Held = std::optional<at::Tensor>;
  static Held convert(CallState& s, const std::optional<at::Tensor>& t, size_t a) {
    return t.has_value() ? Held(*s.toAlias(*t, a, false)) : std::nullopt;
  }
  static const Held& pass(Held& h) {
    return h;
  }
};

// A list argument's native aliases as the kernel reads them, one array in
// order: a few in place (cat's two or three; no heap allocation per call),
// a longer list (an optimizer's foreach lists) on the heap. The entries are
// borrowed: the call's records (CallState::aliases) own the aliases, and the
// caller the other elements, so an element costs no reference counting.
class BorrowedList {
 public:
  BorrowedList() = default;
  BorrowedList(BorrowedList&&) = default; // the moved-from array is left empty
  BorrowedList& operator=(BorrowedList&&) = delete;
  ~BorrowedList() {
    for (at::Tensor& t : tensors_) {
      c10::MaybeOwnedTraits<at::Tensor>::destroyBorrow(t);
    }
  }

  template <class List>
  static BorrowedList of(CallState& s, const List& list, size_t arg) {
    BorrowedList out;
    out.tensors_.reserve(list.size());
    s.aliases.reserve(s.aliases.size() + list.size()); // one growth, not one per few elements
    for (const at::Tensor& t : list) {
      out.tensors_.push_back(c10::MaybeOwnedTraits<at::Tensor>::createBorrow(*s.toAlias(t, arg, true)));
    }
    return out;
  }

  at::TensorList get() const {
    return tensors_;
  }

 private:
  c10::SmallVector<at::Tensor, 4> tensors_;
};

template <>
struct Arg<at::TensorList> {
  using Held = BorrowedList;
  static Held convert(CallState& s, at::TensorList list, size_t a) {
    return BorrowedList::of(s, list, a);
  }
  static at::TensorList pass(Held& h) {
    return h.get();
  }
};

template <>
struct Arg<const at::ITensorListRef&> {
  using Held = BorrowedList;
  static Held convert(CallState& s, const at::ITensorListRef& list, size_t a) {
    return BorrowedList::of(s, list, a);
  }
  static at::ITensorListRef pass(Held& h) {
    return at::ITensorListRef(h.get());
  }
};

template <>
struct Arg<const c10::List<std::optional<at::Tensor>>&> {
  using Held = c10::List<std::optional<at::Tensor>>;
  static Held convert(CallState& s, const c10::List<std::optional<at::Tensor>>& list, size_t a) {
    Held out;
    out.reserve(list.size());
    for (const std::optional<at::Tensor>& t : list) {
      // The list hands out copies, not references: hold them for the call.
      out.push_back(t.has_value() ? std::optional<at::Tensor>(*s.toAliasKept(*t, a, true)) : std::nullopt);
    }
    return out;
  }
  static const Held& pass(Held& h) {
    return h;
  }
};

// How a native result comes back. Non-tensor values as they are.
template <class R>
struct Ret {
  static R convert(CallState&, R&& r, c10::DeviceIndex) {
    return std::move(r);
  }
};

template <>
struct Ret<at::Tensor> {
  static at::Tensor convert(CallState& s, at::Tensor&& r, c10::DeviceIndex index) {
    return s.fromNative(std::move(r), index);
  }
};

template <>
struct Ret<std::vector<at::Tensor>> {
  static std::vector<at::Tensor> convert(CallState& s, std::vector<at::Tensor>&& r, c10::DeviceIndex index) {
    for (at::Tensor& t : r) {
      t = s.fromNative(std::move(t), index);
    }
    return std::move(r);
  }
};

template <class... T>
struct Ret<std::tuple<T...>> {
  static std::tuple<T...> convert(CallState& s, std::tuple<T...>&& r, c10::DeviceIndex index) {
    return std::apply(
        [&](auto&&... e) { return std::tuple<T...>(Ret<T>::convert(s, std::move(e), index)...); }, std::move(r));
  }
};

// Signatures whose calls can take the short path (SharedKernel::shortCall):
// arguments that are tensors or plain values (no lists), and either a tensor
// result with every tensor argument read as it is (optional tensors too:
// linear's bias, SDPA's mask), or (in-place, out=) one written tensor
// argument, which is the result, and no optional tensors. A read tensor may
// be a Python number's wrapped CPU scalar (`x + 1e-6`, `x.mul_(0.5)`),
// which goes to the native kernel as it is, as on the general path.
template <class T>
inline constexpr bool kReadTensor = std::is_same_v<T, const at::Tensor&>;
template <class T>
inline constexpr bool kWrittenTensor = std::is_same_v<T, at::Tensor&>;
template <class T>
inline constexpr bool kShortTensor = kReadTensor<T> || kWrittenTensor<T>;
template <class T>
inline constexpr bool kOptionalTensor = std::is_same_v<T, const std::optional<at::Tensor>&>;
// An argument with a place in the short path's alias array (empty for an
// absent optional tensor).
template <class T>
inline constexpr bool kAliasSlot = kShortTensor<T> || kOptionalTensor<T>;
template <class T>
inline constexpr bool kPlainValue = std::is_same_v<typename Arg<T>::Held, T>;

template <class R, class... A>
inline constexpr bool kShortPathSignature = sizeof...(A) > 0 &&
    ((std::is_same_v<R, at::Tensor> && ((kAliasSlot<A> || kPlainValue<A>) && ...) && (kReadTensor<A> || ...) &&
      !(kWrittenTensor<A> || ...)) ||
     (std::is_same_v<R, at::Tensor&> && ((kShortTensor<A> || kPlainValue<A>) && ...) &&
      (size_t{kWrittenTensor<A>} + ...) == 1));

// What the short path passes for an argument: an optional tensor's alias
// goes in an optional of its own (a reference count, no allocation).
template <class T>
struct ShortPass {
  using type = T;
};
template <>
struct ShortPass<const std::optional<at::Tensor>&> {
  using type = std::optional<at::Tensor>;
};

// For each argument, its place among the tensor arguments (read, written
// or optional).
template <class... A>
constexpr std::array<size_t, sizeof...(A)> tensorOrdinals() {
  constexpr bool is_tensor[] = {kAliasSlot<A>...};
  std::array<size_t, sizeof...(A)> out{};
  size_t n = 0;
  for (size_t i = 0; i < sizeof...(A); ++i) {
    out[i] = n;
    n += is_tensor[i] ? 1 : 0;
  }
  return out;
}

// The short path's aliases, back to the pool when the call is over (after
// its result is taken over or its written argument updated, which read
// them), thrown or not.
template <size_t N>
struct ShortAliases {
  detail::AliasPool* pool;
  detail::Alias entries[N]{}; // a wrapped scalar's stays empty
  bool shared = false; // some alias uses the written one's storage
  size_t scalars = 0;
  // The wrapped scalars' storages, never to be taken over: only the first
  // `scalars` are set and read (left uninitialised: no stores per call).
  const c10::StorageImpl* scalar_storages[N];
  // Per alias slot, the entry its argument passes: its own, or an earlier
  // one for a tensor that came before in another argument (one alias, as
  // natively one tensor: kernels test is_same). Set for every slot.
  uint8_t source[N];
  explicit ShortAliases(detail::AliasPool* p) : pool(p) {}
  ShortAliases(const ShortAliases&) = delete;
  ShortAliases& operator=(const ShortAliases&) = delete;
  ~ShortAliases() {
    if (C10_UNLIKELY(shared)) {
      detail::restoreStorages(entries, N);
    }
    for (detail::Alias& a : entries) {
      detail::recycleAlias(pool, std::move(a.pooled), a.native_storage);
    }
  }
};

// The commonest metadata-only views, called straight into their ATen
// implementation instead of redispatched, where the runtime's native device
// is CPU or CUDA: native_functions.yaml gives both devices this same function
// for them (as the generated CPU/CUDA wrappers call it). A view is a few
// hundred instructions; the redispatch was a third of flagos's share.
template <class Op>
struct DirectView {
  static constexpr bool kAvailable = false;
};

template <>
struct DirectView<at::_ops::view> {
  static constexpr bool kAvailable = true;
  static at::Tensor call(const at::Tensor& self, c10::SymIntArrayRef size) {
    return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
  }
};

template <>
struct DirectView<at::_ops::as_strided> {
  static constexpr bool kAvailable = true;
  static at::Tensor call(
      const at::Tensor& self,
      c10::SymIntArrayRef size,
      c10::SymIntArrayRef stride,
      std::optional<c10::SymInt> storage_offset) {
    return at::native::as_strided_tensorimpl(
        self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride),
        storage_offset ? std::make_optional(storage_offset->guard_int(__FILE__, __LINE__)) : std::nullopt);
  }
};

// The body of a typed kernel, one per C++ signature, not per overload: mul
// and mm, or rsqrt, neg and silu, run the same code. In a model dozens of
// other ops run between two calls of one overload, so code of its own would
// be fetched anew on every call; code shared by many overloads stays near.
// The overload comes in as its routing slot and its native handle.
template <class Sig>
struct SharedKernel;

template <class R, class... A>
struct SharedKernel<R(A...)> {
  using Handle = c10::TypedOperatorHandle<R(A...)>;

  // What a call needs of its overload, set once at registration, together
  // in one place.
  struct Overload {
    Handle native; // redispatched with the native keys
    c10::BoxedKernel boxed; // for a provider that is not a relabel provider
    uint64_t written; // the arguments the schema writes (bit i: argument i)
  };

  C10_NOINLINE static R call(size_t slot, const Overload& overload, c10::DispatchKeySet keys, A... args) {
    return entered<DirectView<void>>(detail::enterSlot(slot), overload, keys, std::forward<A>(args)...);
  }

  // The same, for a slot its caller has entered; `View`: the overload's
  // DirectView, for the few views that have their own kernel.
  template <class View>
  C10_ALWAYS_INLINE static R entered(
      const detail::SlotCall& sc,
      const Overload& overload,
      c10::DispatchKeySet keys,
      A... args) {
    RelabelProvider* provider = sc.provider->relabel();
    if (C10_UNLIKELY(provider == nullptr)) { // a conf routed it elsewhere
      return c10::impl::BoxedKernelWrapper<R(A...)>::call(overload.boxed, *sc.op, keys, std::forward<A>(args)...);
    }
    const detail::CallConstants& c = detail::callConstants();
    if (sc.info.metadata_only) {
      if constexpr (View::kAvailable) {
        if (c.direct_views) {
          return View::call(std::forward<A>(args)...);
        }
      }
      return overload.native.redispatch(c.native_keys, std::forward<A>(args)...);
    }
    if constexpr (kShortPathSignature<R, A...>) {
      // A tensor result: only where the schema writes no argument either.
      constexpr bool kWrites = std::is_same_v<R, at::Tensor&>;
      bool scalars = false;
      if (C10_LIKELY(c.single_device && (kWrites || !sc.info.writes) && (onFlagos<A>(args, scalars) && ...) &&
                     (C10_LIKELY(!scalars) || (isFlagosTensor<A>(args) || ...)))) {
        if (detail::AliasPool* pool = detail::threadAliasPool(); C10_LIKELY(pool != nullptr)) {
          return shortCall(sc, c, pool, *provider, overload.native, std::index_sequence_for<A...>{}, args...);
        }
      }
    }
    CallState state(*sc.op, sc.info, c);
    return run(state, *provider, overload, std::index_sequence_for<A...>{}, std::forward<A>(args)...);
  }

 private:
  // Whether the short path takes `arg`: a flagos tensor, or for a read one
  // also a wrapped scalar (setting `scalars`: the caller then checks that
  // some tensor is a flagos one, so the call has a flagos device).
  template <class T>
  C10_ALWAYS_INLINE static bool onFlagos(const std::remove_reference_t<T>& arg, bool& scalars) {
    if constexpr (kShortTensor<T>) {
      if (C10_LIKELY(arg.defined() && arg.device().type() == c10::DeviceType::PrivateUse1)) {
        return true;
      }
      if constexpr (kReadTensor<T>) {
        if (arg.defined() && arg.unsafeGetTensorImpl()->is_wrapped_number()) {
          scalars = true;
          return true;
        }
      }
      return false;
    } else if constexpr (kOptionalTensor<T>) { // absent, or a flagos tensor
      return !arg.has_value() || !arg->defined() || arg->device().type() == c10::DeviceType::PrivateUse1;
    } else {
      return true;
    }
  }

  template <class T>
  static bool isFlagosTensor(const std::remove_reference_t<T>& arg) {
    if constexpr (kShortTensor<T>) {
      return arg.device().type() == c10::DeviceType::PrivateUse1;
    } else if constexpr (kOptionalTensor<T>) {
      return arg.has_value() && arg->defined() && arg->device().type() == c10::DeviceType::PrivateUse1;
    } else {
      return false;
    }
  }

  // The commonest calls, with one flagos device: every tensor argument a
  // flagos tensor, and a tensor result or one written argument. run()'s
  // steps without its bookkeeping for what these calls cannot have (other
  // devices, lists): the aliases in a fixed array, no device to settle.
  template <size_t... I>
  static R shortCall(
      const detail::SlotCall& sc,
      const detail::CallConstants& c,
      detail::AliasPool* pool,
      RelabelProvider& provider,
      const Handle& native,
      std::index_sequence<I...>,
      A... args) {
    constexpr auto kOrdinal = tensorOrdinals<A...>();
    ShortAliases<(size_t{kAliasSlot<A>} + ...)> aliases(pool);
    const c10::DeviceIndex index = 0; // single_device: flagos:0 is the only device
    // A call that writes keeps an alias per argument, as CallState does.
    constexpr bool kOneAliasPerTensor = !std::is_same_v<R, at::Tensor&>;
    (takeShort<A, kOrdinal[I], kOneAliasPerTensor>(args, aliases, c.nativeDevice(index)), ...);
    auto call_native = [&]() -> R {
      NativeScope scope(provider, index);
      return native.redispatch(c.native_keys, passShort<A, kOrdinal[I]>(args, aliases)...);
    };
    if constexpr (std::is_same_v<R, at::Tensor&>) {
      constexpr size_t kWritten = writtenArgument<A...>();
      constexpr size_t kSlots = (size_t{kAliasSlot<A>} + ...); // entries, optional tensors' included
      if constexpr (kSlots > 1) {
        // The written tensor over another one's storage: rare, out of line.
        const c10::StorageImpl* written = aliases.entries[kOrdinal[kWritten]].original->unsafe_storage().unsafeGetStorageImpl();
        bool same = false;
        for (size_t i = 0; i < kSlots; ++i) {
          same |= i != kOrdinal[kWritten] && aliases.entries[i].original != nullptr &&
              aliases.entries[i].original->unsafe_storage().unsafeGetStorageImpl() == written;
        }
        if (C10_UNLIKELY(same)) {
          // The written tensor passed again (as an input): that argument
          // passes the written alias, one tensor as natively (TensorIterator
          // then refuses to resize an out= tensor that is also an input).
          for (size_t i = 0; i < kSlots; ++i) {
            if (i != kOrdinal[kWritten] &&
                aliases.entries[i].original == aliases.entries[kOrdinal[kWritten]].original) {
              aliases.source[i] = static_cast<uint8_t>(kOrdinal[kWritten]);
            }
          }
          aliases.shared = detail::shareWithWritten(aliases.entries, kSlots, kOrdinal[kWritten]);
        }
      }
      // In-place or out=: the kernel wrote through the alias; a resize or
      // re-pointing goes over to the flagos tensor, which is the result.
      call_native();
      detail::writeBack(aliases.entries[kOrdinal[kWritten]], index, {});
      return std::get<kWritten>(std::forward_as_tuple(args...));
    } else {
      at::Tensor out = call_native();
      // As CallState::fromNative, the common case first. An undefined result
      // fails the sole-owner test and is handed back as it is; a native kernel
      // given native aliases only makes no flagos tensor.
      if (C10_LIKELY(detail::relabelIfSoleOwner(out, index))) {
        return out;
      }
      return detail::adoptSharedResult(
          std::move(out), index, aliases.entries,
          c10::ArrayRef<const c10::StorageImpl*>(aliases.scalar_storages, aliases.scalars), *sc.op);
    }
  }

  template <class... B>
  static constexpr size_t writtenArgument() {
    constexpr bool written[] = {kWrittenTensor<B>...};
    for (size_t i = 0; i < sizeof...(B); ++i) {
      if (written[i]) {
        return i;
      }
    }
    return sizeof...(B);
  }

  template <class T, size_t K, bool kOneAliasPerTensor, size_t N>
  C10_ALWAYS_INLINE static void takeShort(
      const std::remove_reference_t<T>& arg,
      ShortAliases<N>& aliases,
      c10::Device native_device) {
    if constexpr (kShortTensor<T>) {
      aliases.source[K] = K;
      if (C10_UNLIKELY(arg.device().type() != c10::DeviceType::PrivateUse1)) { // a wrapped scalar, as it is
        aliases.scalar_storages[aliases.scalars++] = arg.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
        return;
      }
      if constexpr (kOneAliasPerTensor && K > 0) {
        for (size_t j = 0; j < K; ++j) {
          if (aliases.entries[j].original == arg.unsafeGetTensorImpl()) {
            aliases.source[K] = static_cast<uint8_t>(j);
            return;
          }
        }
      }
      takeAlias(arg, aliases.entries[K], aliases.pool, native_device);
    } else if constexpr (kOptionalTensor<T>) {
      aliases.source[K] = K;
      if (arg.has_value() && arg->defined()) { // else the entry stays empty
        takeAlias(*arg, aliases.entries[K], aliases.pool, native_device);
      }
    }
  }

  C10_ALWAYS_INLINE static void takeAlias(
      const at::Tensor& t,
      detail::Alias& a,
      detail::AliasPool* pool,
      c10::Device native_device) {
    a.pooled = detail::pooledAlias(pool, t, native_device, &a.native_storage);
    a.native = a.pooled.unsafeGetTensorImpl();
    a.original = t.unsafeGetTensorImpl();
  }

  template <class T, size_t K, size_t N>
  C10_ALWAYS_INLINE static typename ShortPass<T>::type passShort(std::remove_reference_t<T>& arg, ShortAliases<N>& aliases) {
    if constexpr (kReadTensor<T>) {
      const detail::Alias& a = aliases.entries[aliases.source[K]];
      return a.original != nullptr ? a.pooled : arg; // a wrapped scalar has no alias
    } else if constexpr (kShortTensor<T>) {
      return aliases.entries[K].pooled;
    } else if constexpr (kOptionalTensor<T>) {
      const at::Tensor& alias = aliases.entries[K].pooled;
      return alias.defined() ? std::optional<at::Tensor>(alias) : arg;
    } else {
      return static_cast<T>(arg);
    }
  }

  template <class T>
  static constexpr bool kTensorList =
      std::is_same_v<std::decay_t<T>, at::TensorList> || std::is_same_v<std::decay_t<T>, at::ITensorListRef>;

  // How many aliases argument `arg` can take: a list's length, one for a
  // tensor, none for a plain value.
  template <class T>
  static size_t aliasCount(const std::remove_reference_t<T>& arg) {
    if constexpr (kTensorList<T>) {
      return arg.size();
    } else {
      return kAliasSlot<T> ? 1 : 0;
    }
  }

  template <size_t... I>
  static R run(CallState& state, RelabelProvider& provider, const Overload& overload, std::index_sequence<I...>, A... args) {
    if constexpr ((kTensorList<A> || ...)) {
      // The call's alias records in one allocation: a foreach call's lists
      // (an optimizer's, hundreds of tensors) would otherwise grow them list
      // by list, moving the records made so far.
      state.aliases.reserve((aliasCount<A>(args) + ...));
    }
    // Braced initialisation: arguments convert left to right, as in the schema.
    std::tuple<typename Arg<A>::Held...> held{Arg<A>::convert(state, args, I)...};
    if (overload.written != 0) {
      state.shareStorages(overload.written);
    }
    c10::OptionalDeviceGuard guard;
    const c10::DeviceIndex index = state.settleDevice(guard);
    auto call_native = [&]() -> decltype(auto) {
      NativeScope scope(provider, index);
      return overload.native.redispatch(state.consts.native_keys, Arg<A>::pass(std::get<I>(held))...);
    };
    if constexpr (std::is_void_v<R> || std::is_same_v<R, at::Tensor&>) {
      call_native();
      if (overload.written != 0) { // always, for in-place and out= overloads
        state.writeBackWritten(index, overload.written);
      }
      if constexpr (!std::is_void_v<R>) {
        // As PyTorch's own wrappers: in-place ops return their first
        // argument, out= ops their last.
        auto all = std::forward_as_tuple(args...);
        if constexpr (std::is_same_v<std::tuple_element_t<0, std::tuple<A...>>, at::Tensor&>) {
          return std::get<0>(all);
        } else {
          return std::get<sizeof...(A) - 1>(all);
        }
      }
    } else {
      R out = call_native();
      if (overload.written != 0) {
        state.writeBackWritten(index, overload.written);
      }
      return Ret<R>::convert(state, std::move(out), index);
    }
  }
};

// The kernel registered for one overload: hands its slot and handle to the
// shared body. `Slot`: the overload's routing slot, a constant of the
// generated code, so a call reads no per-op variable to find it.
template <class Op, size_t Slot, class Sig = typename Op::schema>
struct Kernel;

template <class Op, size_t Slot, class R, class... A>
struct Kernel<Op, Slot, R(A...)> {
  using Shared = SharedKernel<R(A...)>;
  using Overload = typename Shared::Overload;
  // Made in place at registration, before any call can reach this kernel: a
  // static, not a heap object, so a call finds it at a fixed address.
  alignas(Overload) static inline unsigned char storage[sizeof(Overload)];
  static const Overload& overload() {
    return *std::launder(reinterpret_cast<const Overload*>(storage));
  }

  // Makes the overload's record in place, at registration, before any call
  // can reach the kernel; never destroyed: kernels may run at exit.
  static void makeOverload() {
    auto handle =
        c10::Dispatcher::singleton().findSchemaOrThrow(Op::name, Op::overload_name).template typed<typename Op::schema>();
    const uint64_t written = detail::writtenArguments(handle.schema());
    new (storage) Overload{std::move(handle), detail::providerBoxedKernel(Slot), written};
  }

  static R call(c10::DispatchKeySet keys, A... args) {
    if constexpr (DirectView<Op>::kAvailable) {
      // A view calls its own function: the shared body inlined with it here.
      return Shared::template entered<DirectView<Op>>(detail::enterSlot(Slot), overload(), keys, std::forward<A>(args)...);
    } else {
      return Shared::call(Slot, overload(), keys, std::forward<A>(args)...);
    }
  }
};

// Registers the typed kernel of `Op` for routing slot `Slot`.
template <class Op, size_t Slot>
void registerTyped(torch::Library& m, const char* overload) {
  Kernel<Op, Slot>::makeOverload();
  m.impl(overload, torch::CppFunction::makeFromUnboxedFunction(TORCH_FN((Kernel<Op, Slot>::call))));
}

} // namespace flagos::typed
