// The router: routing slots, their registration with the dispatcher, and
// tracing. A call is: slot index (baked into the registered kernel) ->
// atomic provider pointer -> provider->call.

#include <flagos/Router.h>
#include <flagos/Runtime.h>

#include "core/OpTable.h"
#include "core/RouterInternal.h"

#include <torch/library.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

namespace flagos {
namespace {

constexpr size_t kMaxProviders = 32;
// Overloads outside native_functions.yaml (other namespaces, custom ops) get
// a slot when first seen, up to this many.
constexpr size_t kMaxDynamicSlots = 8192;

// A call reads a slot's first four members: one cache line, as slots are
// line-aligned.
struct alignas(64) Slot {
  std::atomic<KernelProvider*> provider{nullptr};
  // Everything below is guarded by Router::mutex.
  std::optional<c10::OperatorHandle> handle; // set by describe()
  bool exact_device = false;
  bool writes = false; // published with `provider`
  bool takes_generator = false;
  bool metadata_only = false;
  std::string name;
  KernelProvider* explicit_provider = nullptr;
  std::string layer = "default";
  // A slot made for an overload outside the generated table that is a
  // composite (its kernel for every device calls other overloads): it never
  // reaches the router, so it cannot be routed.
  bool composite = false;
};

struct alignas(64) Router {
  // What a call reads, together at the front.
  std::unique_ptr<Slot[]> slots;
  std::atomic<int> trace_depth{0};
  std::atomic<bool> log_dispatch{false};
  // Whether composite ops may run whole on the native device
  // (WholeKernel.h): 1 yes, 0 no, -1 to be worked out again (routes changed).
  std::atomic<int> whole_state{-1};
  bool whole_enabled = true; // the switch (setWholeOps), under `mutex`
  std::unique_ptr<std::atomic<uint64_t>[]> counters;
  std::mutex mutex;
  size_t slot_count = 0;
  size_t capacity = 0;
  std::unordered_map<std::string, size_t> by_name;
  std::unordered_map<const void*, size_t> dynamic_by_op;
  std::vector<std::shared_ptr<KernelProvider>> providers;
  KernelProvider* default_provider = nullptr;

  Router() {
    capacity = generated::kOpTableSize + kMaxDynamicSlots;
    slots.reset(new Slot[capacity]);
    counters.reset(new std::atomic<uint64_t>[capacity * kMaxProviders]);
    for (size_t i = 0; i < capacity * kMaxProviders; ++i) {
      counters[i].store(0, std::memory_order_relaxed);
    }
    for (size_t i = 0; i < generated::kOpTableSize; ++i) {
      addSlotLocked(generated::kOpTable[i].overload, generated::kOpTable[i].exact_device);
    }
  }

  size_t addSlotLocked(const std::string& name, bool exact_device) {
    TORCH_CHECK(slot_count < capacity, "flagos: more than ", kMaxDynamicSlots, " custom operators were routed");
    Slot& slot = slots[slot_count];
    slot.name = name;
    slot.exact_device = exact_device;
    by_name.emplace(name, slot_count);
    return slot_count++;
  }

  KernelProvider* providerLocked(const std::string& name) {
    for (auto& p : providers) {
      if (p->name() == name) {
        return p.get();
      }
    }
    return nullptr;
  }

  std::string providerListLocked() {
    std::string out;
    for (auto& p : providers) {
      out += (out.empty() ? "" : ", ") + p->name();
    }
    return out;
  }
};

Router& router() {
  static Router* instance = new Router(); // never destroyed: kernels may run at exit
  return *instance;
}

std::optional<c10::OperatorHandle> findHandle(const std::string& overload) {
  std::string qualified = overload.find("::") == std::string::npos ? "aten::" + overload : overload;
  const auto dot = qualified.find('.', qualified.find("::"));
  c10::OperatorName name(
      dot == std::string::npos ? qualified : qualified.substr(0, dot),
      dot == std::string::npos ? "" : qualified.substr(dot + 1));
  return c10::Dispatcher::singleton().findOp(name);
}

bool isWritten(const c10::Argument& arg) {
  return arg.alias_info() != nullptr && arg.alias_info()->isWrite();
}

// What providers need to know of an overload's schema, read once, and its
// handle (set before `provider` is first published).
void describe(Slot& slot, const c10::OperatorHandle& op) {
  if (!slot.handle) {
    slot.handle = op;
  }
  static const std::unordered_set<std::string> metadata_views = {
      "view", "view.dtype", "as_strided", "_reshape_alias", "unfold", "view_as_real", "view_as_complex"};
  slot.metadata_only = metadata_views.count(slot.name) != 0;
  for (const auto& arg : op.schema().arguments()) {
    slot.writes = slot.writes || isWritten(arg);
    slot.takes_generator = slot.takes_generator || isOptionalGenerator(arg);
  }
  // Kernels that read their arguments' storage identity: CUDA's `equal`
  // answers true for two tensors over one storage with the same geometry
  // without comparing values (NaNs included). Taken as writing calls, their
  // aliases of one flagos storage share one native storage, as natively.
  static const std::unordered_set<std::string> compare_storages = {"equal"};
  slot.writes = slot.writes || compare_storages.count(slot.name) != 0;
}

KernelProvider* resolve(size_t index, const c10::OperatorHandle& op) {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  Slot& slot = r.slots[index];
  KernelProvider* chosen = nullptr;
  if (slot.explicit_provider != nullptr) {
    chosen = slot.explicit_provider;
  } else if (r.default_provider != nullptr && r.default_provider->canServe(op)) {
    chosen = r.default_provider;
    slot.layer = "default";
  } else {
    // The core's own composite kernels (flagos_core/_composite/),
    // where it has one, before a round trip through the CPU: they are for
    // overloads PyTorch calls on PrivateUse1 tensors that the CPU lacks too.
    KernelProvider* composite = r.providerLocked("composite");
    chosen = composite != nullptr && composite->canServe(op) ? composite : r.providerLocked("cpu_fallback");
    slot.layer = "default (" +
        (r.default_provider ? r.default_provider->name() : std::string("no provider")) +
        " has no kernel)";
  }
  TORCH_CHECK(chosen != nullptr, "flagos: no provider can run ", slot.name, "; live providers: ", r.providerListLocked());
  describe(slot, op);
  slot.provider.store(chosen, std::memory_order_release);
  return chosen;
}

OpSlotInfo infoOf(size_t index, const Slot& slot) {
  return OpSlotInfo{index, slot.exact_device, slot.writes, slot.takes_generator, slot.metadata_only};
}

// The provider of slot `index` for this call: resolved on first use,
// counted for trace(), logged under FLAGOS_LOG_DISPATCH.
KernelProvider* providerForCall(size_t index, const c10::OperatorHandle* op) {
  Router& r = router();
  Slot& slot = r.slots[index];
  KernelProvider* provider = slot.provider.load(std::memory_order_acquire);
  if (C10_UNLIKELY(provider == nullptr)) {
    // Typed kernels pass no handle; look it up (first call only), since
    // slot.handle may be being written by another thread's resolve().
    auto handle = op != nullptr ? std::optional<c10::OperatorHandle>(*op) : findHandle(slot.name);
    TORCH_CHECK(handle.has_value(), "flagos: the dispatcher does not know ", slot.name);
    provider = resolve(index, *handle);
  }
  if (C10_UNLIKELY(r.trace_depth.load(std::memory_order_relaxed) > 0)) {
    r.counters[index * kMaxProviders + provider->index].fetch_add(1, std::memory_order_relaxed);
  }
  if (C10_UNLIKELY(r.log_dispatch.load(std::memory_order_relaxed))) {
    std::fprintf(stderr, "flagos: %s -> %s\n", slot.name.c_str(), provider->name().c_str());
  }
  return provider;
}

void dispatchSlot(size_t index, const c10::OperatorHandle& op, c10::DispatchKeySet keys, Stack* stack) {
  KernelProvider* provider = providerForCall(index, &op);
  provider->call(op, keys, stack, infoOf(index, router().slots[index]));
}

// The kernel registered for each generated overload: it carries its slot.
class SlotKernel final : public c10::OperatorKernel {
 public:
  explicit SlotKernel(size_t slot) : slot_(slot) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, Stack* stack) {
    dispatchSlot(slot_, op, keys, stack);
  }

 private:
  size_t slot_;
};

size_t dynamicSlot(const c10::OperatorHandle& op) {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  const void* key = &op.operator_name();
  auto found = r.dynamic_by_op.find(key);
  if (found != r.dynamic_by_op.end()) {
    return found->second;
  }
  const std::string name = overloadName(op);
  auto existing = r.by_name.find(name);
  size_t index = existing != r.by_name.end() ? existing->second : r.addSlotLocked(name, false);
  if (existing == r.by_name.end()) {
    r.slots[index].composite = op.hasKernelForDispatchKey(c10::DispatchKey::CompositeImplicitAutograd) ||
        op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutograd) ||
        op.hasKernelForDispatchKey(c10::DispatchKey::CompositeExplicitAutogradNonFunctional);
  }
  r.dynamic_by_op.emplace(key, index);
  return index;
}

// Every overload the generated table does not list lands here.
void dynamicKernel(const c10::OperatorHandle& op, c10::DispatchKeySet keys, Stack* stack) {
  dispatchSlot(dynamicSlot(op), op, keys, stack);
}

// Overloads the core serves itself (allocation, copies, record_stream,
// is_set_to: CoreKernels.cpp).
const std::unordered_set<std::string>& coreOwned() {
  static const std::unordered_set<std::string> names = {
      "empty.memory_format", "empty_strided", "copy_", "_copy_from", "_copy_from_and_resize", "record_stream",
      "is_set_to", "convolution_overrideable", "convolution_backward_overrideable"};
  return names;
}

size_t slotIndexOrThrow(const std::string& overload) {
  auto slot = slotOf(overload);
  TORCH_CHECK(slot.has_value(), "flagos: unknown operator overload '", overload, "'");
  return *slot;
}

} // namespace

// "aten::add.Tensor" -> "add.Tensor"; names outside aten keep their namespace.
std::string overloadName(const std::string& qualified) {
  const std::string prefix = "aten::";
  return qualified.rfind(prefix, 0) == 0 ? qualified.substr(prefix.size()) : qualified;
}

std::string overloadName(const c10::OperatorHandle& op) {
  const auto& n = op.operator_name();
  std::string name = overloadName(n.name);
  return n.overload_name.empty() ? name : name + "." + n.overload_name;
}

bool isOptionalGenerator(const c10::Argument& arg) {
  const auto& type = arg.type();
  return type->kind() == c10::TypeKind::OptionalType &&
      type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType;
}

void registerProvider(std::shared_ptr<KernelProvider> provider) {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.providerLocked(provider->name()) != nullptr) {
    return;
  }
  TORCH_CHECK(r.providers.size() < kMaxProviders, "flagos: at most ", kMaxProviders, " kernel providers");
  provider->index = static_cast<int>(r.providers.size());
  r.providers.push_back(std::move(provider));
}

KernelProvider* findProvider(const std::string& name) {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.providerLocked(name);
}

std::string defaultProviderName() {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.default_provider != nullptr ? r.default_provider->name() : std::string();
}

std::vector<std::string> providerNames() {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (auto& p : r.providers) {
    names.push_back(p->name());
  }
  return names;
}

std::optional<size_t> slotOf(const std::string& overload) {
  Router& r = router();
  const std::string name = overloadName(overload);
  {
    std::lock_guard<std::mutex> lock(r.mutex);
    auto found = r.by_name.find(name);
    if (found != r.by_name.end()) {
      return found->second;
    }
  }
  auto handle = findHandle(name);
  if (!handle) {
    return std::nullopt;
  }
  return dynamicSlot(*handle);
}

std::string slotName(size_t slot) {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  TORCH_CHECK(slot < r.slot_count, "flagos: no routing slot ", slot);
  return r.slots[slot].name;
}

std::string routeOf(const std::string& overload) {
  const std::string name = overloadName(overload);
  if (coreOwned().count(name)) {
    return "core";
  }
  const size_t index = slotIndexOrThrow(name);
  KernelProvider* provider = router().slots[index].provider.load(std::memory_order_acquire);
  if (provider == nullptr) {
    auto handle = findHandle(name);
    TORCH_CHECK(handle.has_value(), "flagos: unknown operator overload '", overload, "'");
    provider = resolve(index, *handle);
  }
  return provider->name();
}

std::string routeLayerOf(const std::string& overload) {
  routeOf(overload); // resolves the default if needed
  Router& r = router();
  const size_t index = slotIndexOrThrow(overload);
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.slots[index].layer;
}

namespace {

// What a route names, found before the router's lock is taken (the
// dispatcher has its own).
struct RouteTarget {
  std::string name;
  std::optional<size_t> index;
  std::optional<c10::OperatorHandle> handle;
};

RouteTarget routeTarget(const std::string& overload) {
  RouteTarget target{overloadName(overload), std::nullopt, std::nullopt};
  if (!coreOwned().count(target.name)) {
    target.index = slotOf(target.name);
    target.handle = findHandle(target.name);
  }
  return target;
}

// Why routing `target` to `provider_name` is refused, "" if it is not; the
// provider, where it exists, through `found`. r.mutex held.
std::string routeRefusalLocked(
    Router& r, const RouteTarget& target, const std::string& provider_name, KernelProvider** found) {
  const std::string& name = target.name;
  if (coreOwned().count(name)) {
    return name + " is served by the core itself and cannot be routed";
  }
  if (!target.index) {
    return "unknown operator overload '" + name + "'";
  }
  // The route would be taken, reported, and do nothing.
  if (r.slots[*target.index].composite) {
    return name + " cannot be routed: PyTorch runs it as a composite on every device, which calls other " +
        "overloads (flagos_core.trace() lists them); route those instead";
  }
  KernelProvider* provider = r.providerLocked(provider_name);
  *found = provider;
  if (provider == nullptr) {
    return "unknown provider '" + provider_name + "' for " + name + "; valid providers: " + r.providerListLocked();
  }
  if (target.handle && !provider->canServe(*target.handle)) {
    const std::string refusal =
        provider_name == "cpu_fallback" ? detail::cpuFallbackRefusal(*target.handle) : std::string();
    return refusal.empty() ? "provider '" + provider_name + "' has no kernel for " + name
                           : "cpu_fallback cannot serve " + name + ": " + refusal;
  }
  return {};
}

} // namespace

std::string routeRefusal(const std::string& overload, const std::string& provider_name) {
  const RouteTarget target = routeTarget(overload);
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  KernelProvider* provider = nullptr;
  return routeRefusalLocked(r, target, provider_name, &provider);
}

void setRoute(const std::string& overload, const std::string& provider_name, const std::string& layer) {
  const RouteTarget target = routeTarget(overload);
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  KernelProvider* provider = nullptr;
  const std::string refusal = routeRefusalLocked(r, target, provider_name, &provider);
  TORCH_CHECK(refusal.empty(), "flagos: ", refusal);
  const size_t index = *target.index;
  const auto& handle = target.handle;
  Slot& slot = r.slots[index];
  slot.explicit_provider = provider;
  slot.layer = layer;
  r.whole_state.store(-1, std::memory_order_release);
  if (handle) {
    describe(slot, *handle);
    slot.provider.store(provider, std::memory_order_release);
  } else {
    slot.provider.store(nullptr, std::memory_order_release); // resolved, and described, on first call
  }
}

void clearRoute(const std::string& overload) {
  const size_t index = slotIndexOrThrow(overload);
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  Slot& slot = r.slots[index];
  slot.explicit_provider = nullptr;
  slot.layer = "default";
  r.whole_state.store(-1, std::memory_order_release);
  slot.provider.store(nullptr, std::memory_order_release); // re-resolved on next call
}

void setDefaultProvider(const std::string& provider_name) {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  KernelProvider* provider = r.providerLocked(provider_name);
  TORCH_CHECK(provider != nullptr, "flagos: unknown provider '", provider_name, "'; valid providers: ", r.providerListLocked());
  r.default_provider = provider;
  r.whole_state.store(-1, std::memory_order_release);
  for (size_t i = 0; i < r.slot_count; ++i) {
    if (r.slots[i].explicit_provider == nullptr) {
      r.slots[i].provider.store(nullptr, std::memory_order_release);
    }
  }
}

std::vector<std::string> slotNames() {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  names.reserve(r.slot_count);
  for (size_t i = 0; i < r.slot_count; ++i) {
    if (!coreOwned().count(r.slots[i].name) && !r.slots[i].composite) {
      names.push_back(r.slots[i].name);
    }
  }
  return names;
}

bool canServe(const std::string& overload, const std::string& provider_name) {
  auto handle = findHandle(overloadName(overload));
  TORCH_CHECK(handle.has_value(), "flagos: unknown operator overload '", overload, "'");
  KernelProvider* provider = findProvider(provider_name);
  TORCH_CHECK(provider != nullptr, "flagos: unknown provider '", provider_name, "'; valid providers: ", [] {
    std::string out;
    for (const auto& n : providerNames()) {
      out += (out.empty() ? "" : ", ") + n;
    }
    return out;
  }());
  return provider->canServe(*handle);
}

void setWholeOps(bool enabled) {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.whole_enabled = enabled;
  r.whole_state.store(-1, std::memory_order_release);
}

bool wholeOpsOn() {
  return detail::wholeCallsOn();
}

void setLogDispatch(bool enabled) {
  router().log_dispatch.store(enabled);
}

namespace {

TraceCounts traceCountsLocked(Router& r) {
  TraceCounts counts;
  for (size_t s = 0; s < r.slot_count; ++s) {
    for (size_t p = 0; p < r.providers.size(); ++p) {
      const uint64_t n = r.counters[s * kMaxProviders + p].load(std::memory_order_relaxed);
      if (n != 0) {
        counts[{r.slots[s].name, r.providers[p]->name()}] = n;
      }
    }
  }
  return counts;
}

} // namespace

TraceCounts traceBegin() {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  if (r.trace_depth.fetch_add(1) > 0) {
    return traceCountsLocked(r);
  }
  for (size_t i = 0; i < r.capacity * kMaxProviders; ++i) {
    r.counters[i].store(0, std::memory_order_relaxed);
  }
  return {};
}

TraceCounts traceEnd() {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  TraceCounts counts = traceCountsLocked(r);
  if (r.trace_depth.load() > 0) {
    r.trace_depth.fetch_sub(1);
  }
  return counts;
}

namespace detail {

SlotCall enterSlot(size_t index) {
  KernelProvider* provider = providerForCall(index, nullptr);
  const Slot& slot = router().slots[index];
  return SlotCall{provider, &*slot.handle, infoOf(index, slot)};
}

namespace {

class ProviderKernel final : public c10::OperatorKernel {
 public:
  explicit ProviderKernel(size_t slot) : slot_(slot) {}
  void operator()(const c10::OperatorHandle& op, c10::DispatchKeySet keys, Stack* stack) {
    Slot& slot = router().slots[slot_];
    KernelProvider* provider = slot.provider.load(std::memory_order_acquire);
    TORCH_INTERNAL_ASSERT(provider != nullptr, "flagos: slot ", slot.name, " has no provider");
    provider->call(op, keys, stack, infoOf(slot_, slot));
  }

 private:
  size_t slot_;
};

} // namespace

uint64_t writtenArguments(const c10::FunctionSchema& schema) {
  const auto& args = schema.arguments();
  uint64_t written = 0;
  for (size_t i = 0; i < args.size() && i < 64; ++i) {
    if (isWritten(args[i])) {
      written |= uint64_t{1} << i;
    }
  }
  return written;
}

bool wholeCallsOnSlowly() {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  // Off unless the default provider relabels for the native device, and no
  // route sends an overload that the native device can run elsewhere: its
  // decomposition there might reach that overload and bypass the route.
  // Routes of overloads it has no kernel for (the CUDA plugin's for SDPA's
  // CPU flash kernels) cannot be reached there.
  bool on = r.whole_enabled && r.default_provider != nullptr && r.default_provider->relabel() != nullptr &&
      hasActiveRuntime();
  if (on) {
    const c10::DispatchKey native = activeRuntime().nativeDispatchKey();
    for (size_t i = 0; i < r.slot_count && on; ++i) {
      const Slot& slot = r.slots[i];
      if (slot.explicit_provider == nullptr || slot.explicit_provider == r.default_provider) {
        continue;
      }
      auto handle = slot.handle ? slot.handle : findHandle(slot.name);
      on = handle.has_value() && !handle->hasComputedKernelForDispatchKey(native);
    }
  }
  r.whole_state.store(on ? 1 : 0, std::memory_order_release);
  return on;
}

bool wholeCallsOn() {
  const int state = router().whole_state.load(std::memory_order_acquire);
  if (C10_LIKELY(state >= 0)) {
    return state == 1;
  }
  return wholeCallsOnSlowly();
}

RelabelProvider* defaultRelabelProvider() {
  Router& r = router();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.default_provider != nullptr ? r.default_provider->relabel() : nullptr;
}

c10::BoxedKernel providerBoxedKernel(size_t index) {
  return c10::BoxedKernel::makeFromFunctor(std::make_unique<ProviderKernel>(index));
}

} // namespace detail

} // namespace flagos

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  using flagos::generated::kOpTable;
  for (size_t i = 0; i < flagos::generated::kOpTableSize; ++i) {
    if (kOpTable[i].typed || flagos::coreOwned().count(kOpTable[i].overload)) {
      continue; // typed rows register in the generated TypedKernels*.cpp
    }
    m.impl(
        kOpTable[i].overload,
        torch::CppFunction::makeFromBoxedFunctor(std::make_unique<flagos::SlotKernel>(i)));
  }
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&flagos::dynamicKernel>());
}
