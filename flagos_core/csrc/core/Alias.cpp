#include "core/Alias.h"

#include "core/CallConstants.h"

#include <flagos/Runtime.h>

#include <c10/util/SmallVector.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace flagos::detail {
namespace {

// A native storage over a flagos storage's memory that may outlive the call
// that made it (an export): as_native's and nativeAliasOf's tensors, an alias
// a kernel kept. Natively, tensors sharing memory share one StorageImpl, so a
// resize or a move into shared memory is seen by all of them. Here the
// flagos storage owns the memory, so when it moves, every export of it is
// pointed at the new memory (followExports); an export holding the old
// pointer would read freed memory.
struct ExportRecord {
  c10::StorageImpl* flagos; // holds a reference: the memory outlives the export
  c10::StorageImpl* native = nullptr; // the export's StorageImpl, once made (not owned)
};

// The exports of each flagos storage that has any. Consulted only when a
// flagos storage moves (rare: a resize, share_memory_), and changed when an
// export is made or freed, never on a plain call.
struct ExportRegistry {
  std::mutex mutex;
  std::unordered_map<const c10::StorageImpl*, c10::SmallVector<ExportRecord*, 1>> by_flagos;
  std::atomic<size_t> count{0};
};

ExportRegistry& exportRegistry() {
  static auto* registry = new ExportRegistry(); // never destroyed: exports may die at exit
  return *registry;
}

void releaseExport(void* ctx) {
  auto* record = static_cast<ExportRecord*>(ctx);
  if (record->native != nullptr) {
    ExportRegistry& r = exportRegistry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto found = r.by_flagos.find(record->flagos);
    if (found != r.by_flagos.end()) {
      auto& list = found->second;
      list.erase(std::remove(list.begin(), list.end(), record), list.end());
      if (list.empty()) {
        r.by_flagos.erase(found);
      }
    }
    r.count.fetch_sub(1, std::memory_order_relaxed);
  }
  // Outside the lock: the last reference frees the flagos storage, whose own
  // memory may be another export's.
  c10::raw::intrusive_ptr::decref(record->flagos);
  delete record;
}

// What an export's storage does when asked to grow: it cannot take new
// memory of its own, or the flagos tensor would no longer see it.
class ExportAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    refuse(nbytes);
  }
  c10::DeleterFnPtr raw_deleter() const override {
    return nullptr;
  }
  void copy_data(void*, const void*, std::size_t nbytes) const override {
    refuse(nbytes);
  }

 private:
  [[noreturn]] static void refuse(size_t nbytes) {
    TORCH_CHECK(
        false, "flagos: this tensor shares its memory with a flagos tensor (flagos_core.as_native, or a plugin's ",
        "native alias), so its storage cannot take new memory (", nbytes, " bytes asked): the flagos tensor would ",
        "no longer see it. Resize the flagos tensor instead; the native one follows it.");
  }
};

ExportAllocator g_export_allocator;

// Owns a native storage on behalf of a flagos DataPtr over the same memory;
// after moveOnto, also the flagos storage's previous allocation.
struct ForeignStorageRef {
  c10::Storage storage;
  c10::DataPtr previous;
};

void deleteForeignStorageRef(void* ctx) {
  delete static_cast<ForeignStorageRef*>(ctx);
}

// The record of the native storage a flagos storage wraps, or null.
ForeignStorageRef* foreignRefOf(const c10::StorageImpl* flagos) {
  const c10::DataPtr& ptr = flagos->data_ptr();
  return ptr.get_deleter() == &deleteForeignStorageRef ? static_cast<ForeignStorageRef*>(ptr.get_context()) : nullptr;
}

} // namespace

void followExports(c10::StorageImpl* flagos) {
  ExportRegistry& r = exportRegistry();
  if (C10_LIKELY(r.count.load(std::memory_order_relaxed) == 0)) {
    return;
  }
  std::lock_guard<std::mutex> lock(r.mutex);
  auto found = r.by_flagos.find(flagos);
  if (found == r.by_flagos.end()) {
    return;
  }
  void* data = flagos->mutable_data_ptr().get();
  for (ExportRecord* record : found->second) {
    c10::DataPtr& ptr = record->native->mutable_data_ptr();
    if (ptr.get() == data) {
      continue;
    }
    const c10::Device device = ptr.device();
    (void)ptr.release_context(); // the new DataPtr below owns the record now
    record->native->set_data_ptr_noswap(c10::DataPtr(data, record, &releaseExport, device));
    record->native->set_nbytes(flagos->nbytes());
  }
}

// A native kernel's quantized result (quantize_per_tensor and the like)
// cannot become a flagos tensor: flagos has no quantized kernels, so every
// later call on it would fail.
void checkNotQuantized(const c10::TensorImpl& impl) {
  TORCH_CHECK_NOT_IMPLEMENTED(
      !impl.is_quantized(),
      "flagos: this call's native kernel returned a quantized tensor, and flagos holds unquantized tensors only. "
      "Quantize on the CPU (.cpu() first), or dequantize (.dequantize()) before moving the result to flagos.");
}

namespace {

// A flagos storage over a native one (from_native, a kernel's view of a
// non-flagos argument) took that storage's data pointer when it was made.
// The native storage can move afterwards (share_memory_, a resize_ that
// grows it) and free the old memory; the flagos storage then follows, as the
// native storage's own tensors do, before any kernel sees its memory.
C10_NOINLINE void* followWrappedStorage(c10::StorageImpl* flagos, ForeignStorageRef* ref) {
  c10::DataPtr& ptr = flagos->mutable_data_ptr();
  c10::StorageImpl* native = ref->storage.unsafeGetStorageImpl();
  void* now = native->mutable_data_ptr().get();
  if (C10_LIKELY(now == ptr.get())) {
    return now;
  }
  static std::mutex moving;
  std::lock_guard<std::mutex> lock(moving);
  if (ptr.get() != now) {
    c10::DataPtr followed(now, ref, &deleteForeignStorageRef, ptr.device());
    (void)ptr.release_context(); // `followed` owns the record now
    flagos->set_data_ptr_noswap(std::move(followed));
    flagos->set_nbytes(native->nbytes());
    followExports(flagos);
  }
  return now;
}

// The flagos storage's memory, for an alias about to be made over it.
void* currentData(c10::StorageImpl* flagos) {
  void* data = flagos->mutable_data_ptr().get();
  if (ForeignStorageRef* ref = foreignRefOf(flagos); C10_UNLIKELY(ref != nullptr)) {
    return followWrappedStorage(flagos, ref);
  }
  return data;
}

// An export's pointer into the flagos storage's memory; registerExport
// enters it once its StorageImpl is made.
c10::DataPtr exportDataPtr(c10::StorageImpl* flagos, c10::Device native) {
  void* data = currentData(flagos);
  c10::raw::intrusive_ptr::incref(flagos);
  return c10::DataPtr(data, new ExportRecord{flagos}, &releaseExport, native);
}

void registerExport(c10::StorageImpl* native) {
  auto* record = static_cast<ExportRecord*>(native->data_ptr().get_context());
  ExportRegistry& r = exportRegistry();
  std::lock_guard<std::mutex> lock(r.mutex);
  record->native = native;
  r.by_flagos[record->flagos].push_back(record);
  r.count.fetch_add(1, std::memory_order_relaxed);
}

// A pooled alias borrows the flagos storage for the call (the caller holds
// the flagos tensor meanwhile): no reference taken. Should a kernel keep the
// alias beyond the call, recycleAlias turns this into an owning DataPtr.
void borrowedFlagosStorage(void*) {}

c10::DataPtr borrowedDataPtr(c10::StorageImpl* flagos, c10::Device native) {
  return c10::DataPtr(currentData(flagos), flagos, &borrowedFlagosStorage, native);
}

// The flagos storage a pooled alias's or an export's pointer is into, or null.
c10::StorageImpl* flagosStorageBehind(const c10::DataPtr& ptr) {
  if (ptr.get_deleter() == &borrowedFlagosStorage) {
    return static_cast<c10::StorageImpl*>(ptr.get_context());
  }
  if (ptr.get_deleter() == &releaseExport) {
    return static_cast<ExportRecord*>(ptr.get_context())->flagos;
  }
  return nullptr;
}

// The TensorImpl of every native alias: a plain TensorImpl that takes a
// flagos tensor's geometry together with its cached contiguity flags (the
// same geometry, so the same flags) instead of recomputing them, which
// set_sizes_and_strides does at several times the cost of the copy.
class AliasImpl final : public c10::TensorImpl {
 public:
  AliasImpl(c10::Storage storage, c10::DispatchKeySet keys)
      : TensorImpl(std::move(storage), keys, caffe2::TypeMeta()) {}

  void takeGeometryOf(const c10::TensorImpl& from) {
    if (C10_UNLIKELY(from.has_symbolic_sizes_strides())) {
      set_sizes_and_strides(from.sizes(), from.strides(), from.storage_offset());
      return;
    }
    sizes_and_strides_ = from.*kSizesAndStrides;
    storage_offset_ = from.*kStorageOffset;
    numel_ = from.*kNumel;
    // The *_default readers: the stored flags (flagos tensors have no custom
    // size/stride policy, and symbolic ones took the branch above). All read
    // before any is written: the compiler cannot tell `from` from `this`, and
    // interleaved, every bit-field write made it read `from` again.
    const bool contiguous = from.is_contiguous_default(c10::MemoryFormat::Contiguous);
    const bool channels_last_contiguous = from.is_contiguous_default(c10::MemoryFormat::ChannelsLast);
    const bool channels_last_3d_contiguous = from.is_contiguous_default(c10::MemoryFormat::ChannelsLast3d);
    const bool channels_last = from.is_strides_like_default(c10::MemoryFormat::ChannelsLast);
    const bool channels_last_3d = from.is_strides_like_default(c10::MemoryFormat::ChannelsLast3d);
    const bool non_overlapping_and_dense = from.is_non_overlapping_and_dense_default();
    is_contiguous_ = contiguous;
    is_channels_last_contiguous_ = channels_last_contiguous;
    is_channels_last_3d_contiguous_ = channels_last_3d_contiguous;
    is_channels_last_ = channels_last;
    is_channels_last_3d_ = channels_last_3d;
    is_non_overlapping_and_dense_ = non_overlapping_and_dense;
  }

  // The stored geometry, read as takeGeometryOf writes it: one loop over
  // sizes and strides together, none of the accessors' policy checks.
  static bool sameGeometry(const c10::TensorImpl& a, const c10::TensorImpl& b) {
    if (C10_UNLIKELY(a.has_symbolic_sizes_strides() || b.has_symbolic_sizes_strides())) {
      return a.sym_sizes() == b.sym_sizes() && a.sym_strides() == b.sym_strides() &&
          a.sym_storage_offset() == b.sym_storage_offset();
    }
    const c10::impl::SizesAndStrides& x = a.*kSizesAndStrides;
    const c10::impl::SizesAndStrides& y = b.*kSizesAndStrides;
    if (x.size() != y.size() || a.*kStorageOffset != b.*kStorageOffset) {
      return false;
    }
    const int64_t* xs = x.sizes_data();
    const int64_t* ys = y.sizes_data();
    const int64_t* xt = x.strides_data();
    const int64_t* yt = y.strides_data();
    for (size_t i = 0; i < x.size(); ++i) {
      if (xs[i] != ys[i] || xt[i] != yt[i]) {
        return false;
      }
    }
    return true;
  }

  void setDtype(caffe2::TypeMeta dtype) {
    data_type_ = dtype;
  }

  static void setZeroBit(c10::TensorImpl& impl, bool zero) {
    const c10::DispatchKeySet keys = impl.*kKeySet;
    impl.*kKeySet = zero ? keys.add(c10::DispatchKey::ZeroTensor) : keys.remove(c10::DispatchKey::ZeroTensor);
  }

  // A native TensorImpl (a kernel's result, seen by nobody else) becomes a
  // flagos one: device and backend keys, as set_storage_keep_dtype and
  // _change_backend_component_keys would, without the storage reference
  // traffic; the translation of a fresh result's keys is precomputed.
  static void relabelAsFlagos(c10::TensorImpl& impl, c10::Device label, const CallConstants& c) {
    impl.*kDeviceOpt = label;
    const c10::DispatchKeySet native = impl.*kKeySet;
    for (int i = 0; i < 2; ++i) {
      if (native == c.native_result_keys[i]) {
        impl.*kKeySet = c.flagos_result_keys[i];
        return;
      }
    }
    checkNotQuantized(impl);
    impl._change_backend_component_keys(label);
  }

 private:
  // Members of TensorImpl named through this class, so they can be read on
  // any TensorImpl (the flagos tensor), not only on this one.
  static constexpr c10::impl::SizesAndStrides c10::TensorImpl::*kSizesAndStrides = &AliasImpl::sizes_and_strides_;
  static constexpr int64_t c10::TensorImpl::*kStorageOffset = &AliasImpl::storage_offset_;
  static constexpr int64_t c10::TensorImpl::*kNumel = &AliasImpl::numel_;
  static constexpr std::optional<c10::Device> c10::TensorImpl::*kDeviceOpt = &AliasImpl::device_opt_;
  static constexpr c10::DispatchKeySet c10::TensorImpl::*kKeySet = &AliasImpl::key_set_;
};

AliasImpl& asAliasImpl(const at::Tensor& alias) {
  return *static_cast<AliasImpl*>(alias.unsafeGetTensorImpl()); // every pooled alias is one
}

} // namespace

// Alias TensorImpls not in use, per native device, for this thread. Each
// keeps its own StorageImpl; between calls it still holds the last borrowed
// pointer, which is never read and whose deleter does nothing.
class AliasPool {
 public:
  AliasPool() = default;
  AliasPool(const AliasPool&) = delete;
  AliasPool& operator=(const AliasPool&) = delete;
  ~AliasPool() {
    for (auto& entry : lists_) {
      for (c10::TensorImpl* impl : entry.second) {
        c10::raw::intrusive_ptr::decref(impl);
      }
    }
  }

  static at::Tensor fresh(c10::Device native) {
    c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
        c10::StorageImpl::use_byte_size_t(), 0, c10::DataPtr(nullptr, native), c10::GetAllocator(native.type()),
        false));
    return at::Tensor(c10::make_intrusive<AliasImpl>(std::move(storage), keysFor(native)));
  }

  at::Tensor take(c10::Device native) {
    std::vector<c10::TensorImpl*>& list = freeList(native);
    if (C10_UNLIKELY(list.empty())) {
      return fresh(native);
    }
    c10::TensorImpl* impl = list.back();
    list.pop_back();
    return at::Tensor(c10::intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>::reclaim(impl));
  }

  void give(c10::intrusive_ptr<c10::TensorImpl> impl, c10::Device native) {
    std::vector<c10::TensorImpl*>& list = freeList(native);
    if (list.size() < kMaxPerDevice) {
      list.push_back(impl.release()); // the pool holds the one reference
    }
  }

 private:
  // Enough for a foreach call over a model's parameter lists (an optimizer
  // step passes three lists of every parameter), at a few hundred bytes each.
  static constexpr size_t kMaxPerDevice = 1024;
  // Nearly always one native device per process: check the first list first.
  std::vector<c10::TensorImpl*>& freeList(c10::Device native) {
    if (C10_LIKELY(!lists_.empty() && lists_[0].first == native)) {
      return lists_[0].second;
    }
    for (auto& entry : lists_) {
      if (entry.first == native) {
        return entry.second;
      }
    }
    lists_.emplace_back(native, std::vector<c10::TensorImpl*>());
    lists_.back().second.reserve(kMaxPerDevice);
    return lists_.back().second;
  }
  c10::SmallVector<std::pair<c10::Device, std::vector<c10::TensorImpl*>>, 2> lists_;
};

namespace {

// This thread's pool, made on first use. The slot is trivially destructible
// (one TLS lookup per access); the reaper frees the pool at thread exit, and
// tensors freed after that find it gone and leave aliases to refcounting.
struct PoolSlot {
  AliasPool* pool = nullptr;
  bool gone = false;
};
thread_local PoolSlot t_pool;

struct PoolReaper {
  ~PoolReaper() {
    delete t_pool.pool;
    t_pool.pool = nullptr;
    t_pool.gone = true;
  }
};

} // namespace

AliasPool* threadAliasPool() {
  PoolSlot& slot = t_pool;
  if (C10_LIKELY(slot.pool != nullptr)) {
    return slot.pool;
  }
  if (slot.gone) {
    return nullptr;
  }
  thread_local PoolReaper reaper;
  (void)reaper;
  slot.pool = new AliasPool();
  return slot.pool;
}

namespace {

at::Tensor takeAlias(AliasPool* pool, c10::Device native) {
  if (C10_LIKELY(pool != nullptr)) {
    return pool->take(native);
  }
  return AliasPool::fresh(native);
}

void giveAlias(AliasPool* pool, c10::intrusive_ptr<c10::TensorImpl> impl, c10::Device native) {
  if (C10_LIKELY(pool != nullptr)) {
    pool->give(std::move(impl), native);
  }
}

// The conjugate, negative and zero bits (dispatch keys, not geometry). A
// zero tensor (forward AD's stand-in for a missing tangent) has no memory:
// PyTorch passes it to a few kernels (copy_, dot, mul by a scalar) that
// test the bit, and an alias without it was read as a real tensor at a null
// pointer (a segfault in torch.func.hessian of l1_loss).
void copyMathBits(const c10::TensorImpl& from, c10::TensorImpl& to) {
  constexpr c10::DispatchKeySet kMathBits(
      {c10::DispatchKey::Conjugate, c10::DispatchKey::Negative, c10::DispatchKey::ZeroTensor});
  if (C10_LIKELY((from.key_set() & kMathBits) == (to.key_set() & kMathBits))) {
    return;
  }
  to._set_conj(from.is_conj());
  to._set_neg(from.is_neg());
  AliasImpl::setZeroBit(to, from._is_zerotensor()); // TensorImpl::_set_zero refuses to set it
}

// `alias` over flagos tensor `t`'s memory with t's geometry, borrowing it for
// the call (recycleAlias makes the pointer owning if a kernel keeps the alias).
void pointAliasAt(AliasImpl& alias, const c10::TensorImpl& t, c10::Device native) {
  c10::StorageImpl* storage = alias.unsafe_storage().unsafeGetStorageImpl();
  c10::StorageImpl* flagos = t.unsafe_storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(borrowedDataPtr(flagos, native));
  storage->set_nbytes(flagos->nbytes());
  if (storage->resizable() != flagos->resizable()) {
    storage->set_resizable(flagos->resizable());
  }
  alias.setDtype(t.dtype());
  alias.takeGeometryOf(t);
  copyMathBits(t, alias);
}

} // namespace

c10::Storage nativeStorageFor(c10::StorageImpl* flagos, c10::Device native, bool growable) {
  c10::DataPtr data = exportDataPtr(flagos, native); // first: a wrapped storage may follow its native one
  c10::Allocator* allocator = growable ? c10::GetAllocator(native.type()) : &g_export_allocator;
  auto impl = c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), flagos->sym_nbytes(), std::move(data), allocator, flagos->resizable());
  registerExport(impl.get());
  return c10::Storage(std::move(impl));
}

c10::Storage exportedStorage(c10::StorageImpl* flagos, c10::Device native) {
  if (ForeignStorageRef* ref = foreignRefOf(flagos)) {
    // The memory is a native storage's (from_native, shared memory): that
    // storage itself, as natively every tensor over the memory shares it.
    c10::Storage& wrapped = ref->storage;
    if (wrapped.device() == native) {
      (void)currentData(flagos);
      return wrapped;
    }
  }
  return nativeStorageFor(flagos, native, false);
}

bool isAliasOf(const c10::DataPtr& native, const c10::StorageImpl* flagos) {
  return flagosStorageBehind(native) == flagos;
}

std::optional<c10::Storage> aliasedFlagosStorage(const c10::Storage& native) {
  c10::StorageImpl* flagos = flagosStorageBehind(native.unsafeGetStorageImpl()->data_ptr());
  if (flagos == nullptr) {
    return std::nullopt;
  }
  return c10::Storage(c10::intrusive_ptr<c10::StorageImpl>::reclaim_copy(flagos));
}

c10::Storage flagosStorageFor(const c10::Storage& native, c10::DeviceIndex index, bool fresh) {
  const c10::Device label(c10::DeviceType::PrivateUse1, index);
  c10::StorageImpl* impl = native.unsafeGetStorageImpl();
  if (impl->data_ptr().device().type() == c10::DeviceType::PrivateUse1) {
    return native;
  }
  if (fresh) {
    impl->mutable_data_ptr().unsafe_set_device(label);
    impl->set_allocator(callConstants().allocator);
    return native;
  }
  void* data = impl->mutable_data_ptr().get();
  // Growable as the native storage is, where a grown alias's memory (the
  // native device's) can become that storage's (growWrappedStorage); not
  // over an export, which cannot take memory of its own.
  const bool resizable = impl->resizable() && impl->allocator() != &g_export_allocator &&
      impl->device() == callConstants().nativeDevice(index);
  c10::DataPtr wrapped(data, new ForeignStorageRef{native}, &deleteForeignStorageRef, label);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->sym_nbytes(), std::move(wrapped),
      resizable ? callConstants().allocator : nullptr, resizable));
}

namespace {

// takeGrownMemory for a flagos storage over a native one; false, changing
// nothing, for any other.
bool growWrappedStorage(c10::StorageImpl* flagos, c10::StorageImpl* grown) {
  ForeignStorageRef* ref = foreignRefOf(flagos);
  if (ref == nullptr) {
    return false;
  }
  c10::StorageImpl* native = ref->storage.unsafeGetStorageImpl();
  // As the native resize would (the native storage may have become fixed
  // since: share_memory_); the grown memory is freed with the alias.
  TORCH_CHECK(native->resizable(), "Trying to resize storage that is not resizable");
  native->set_data_ptr_noswap(std::move(grown->mutable_data_ptr()));
  native->set_nbytes(grown->nbytes());
  (void)currentData(flagos); // follows, and its exports with it
  return true;
}

} // namespace

void takeGrownMemory(c10::StorageImpl* flagos, c10::StorageImpl* grown) {
  if (growWrappedStorage(flagos, grown)) {
    return;
  }
  c10::DataPtr ptr = std::move(grown->mutable_data_ptr());
  ptr.unsafe_set_device(flagos->data_ptr().device());
  flagos->set_data_ptr_noswap(std::move(ptr));
  flagos->set_nbytes(grown->nbytes());
  followExports(flagos);
}

void keepExportOver(c10::StorageImpl* flagos, c10::StorageImpl* native) {
  if (C10_LIKELY(flagosStorageBehind(native->data_ptr()) == flagos)) {
    return; // still over the flagos storage's memory
  }
  const c10::Device device = native->data_ptr().device();
  takeGrownMemory(flagos, native);
  native->set_data_ptr_noswap(exportDataPtr(flagos, device));
  native->set_nbytes(flagos->nbytes());
  registerExport(native);
}

std::optional<c10::Storage> wrappedStorage(const c10::Storage& flagos) {
  const ForeignStorageRef* ref = foreignRefOf(flagos.unsafeGetStorageImpl());
  return ref ? std::optional<c10::Storage>(ref->storage) : std::nullopt;
}

void moveOnto(const c10::Storage& flagos, c10::Storage target) {
  c10::StorageImpl* impl = flagos.unsafeGetStorageImpl();
  c10::StorageImpl* to = target.unsafeGetStorageImpl();
  TORCH_CHECK(to->nbytes() == impl->nbytes(), "flagos: moving a storage of ", impl->nbytes(), " bytes onto one of ",
              to->nbytes());
  TORCH_CHECK(impl->data_ptr().device().type() == c10::DeviceType::PrivateUse1 && to->data_ptr().device().is_cpu() &&
                  activeRuntime().nativeDeviceType() == c10::DeviceType::CPU,
              "flagos: only the host runtime's storages move onto host memory");
  if (impl->nbytes() > 0) {
    std::memcpy(to->mutable_data(), impl->data(), impl->nbytes());
  }
  void* data = to->mutable_data();
  const c10::Device label = impl->data_ptr().device();
  auto* ref = new ForeignStorageRef{std::move(target), c10::DataPtr()};
  ref->previous = impl->set_data_ptr(c10::DataPtr(data, ref, &deleteForeignStorageRef, label));
  impl->set_resizable(false);
  followExports(impl);
}

const c10::DataPtr& allocationOf(const c10::Storage& flagos) {
  const ForeignStorageRef* ref = foreignRefOf(flagos.unsafeGetStorageImpl());
  return ref ? ref->storage.unsafeGetStorageImpl()->data_ptr() : flagos.unsafeGetStorageImpl()->data_ptr();
}

bool sameGeometry(const c10::TensorImpl& a, const c10::TensorImpl& b) {
  return AliasImpl::sameGeometry(a, b);
}

bool aliasUnchanged(const c10::TensorImpl& alias, const c10::TensorImpl& original) {
  return isAliasOf(alias.unsafe_storage().unsafeGetStorageImpl()->data_ptr(),
                   original.unsafe_storage().unsafeGetStorageImpl()) &&
      AliasImpl::sameGeometry(alias, original);
}

c10::DispatchKeySet keysFor(c10::Device device) {
  return c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, c10::kStrided, device));
}

void copyGeometry(const c10::TensorImpl& from, c10::TensorImpl& to) {
  // Only fresh TensorImpls come here (pooled aliases take AliasImpl's copy).
  to.set_sizes_and_strides(from.sizes(), from.strides(), from.storage_offset());
  copyMathBits(from, to);
}

at::Tensor flagosTensorOver(c10::Storage storage, const at::Tensor& geometry) {
  const c10::DispatchKeySet keys = keysFor(storage.device());
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys, geometry.dtype());
  copyGeometry(*geometry.unsafeGetTensorImpl(), *impl);
  return at::Tensor(std::move(impl));
}

at::Tensor pooledAlias(AliasPool* pool, const at::Tensor& t, c10::Device native, const c10::StorageImpl** made) {
  at::Tensor alias = takeAlias(pool, native);
  pointAliasAt(asAliasImpl(alias), *t.unsafeGetTensorImpl(), native);
  *made = alias.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
  return alias;
}

void recycleAlias(AliasPool* pool, at::Tensor&& alias, const c10::StorageImpl* made) {
  if (!alias.defined()) {
    return;
  }
  c10::intrusive_ptr<c10::TensorImpl> impl = std::move(alias).unsafeReleaseIntrusivePtr();
  const c10::Storage& storage = impl->storage();
  c10::StorageImpl* s = storage.unsafeGetStorageImpl();
  if (s != made) {
    return; // re-pointed by the kernel (set_): refcounting frees it
  }
  if (impl.use_count() != 1 || impl.weak_use_count() != 1 || storage.use_count() != 1 ||
      !impl->allow_tensor_metadata_change()) {
    // Kept beyond the call: from here on it owns a reference on the flagos
    // storage, which the caller's tensor keeps alive until now.
    c10::DataPtr& ptr = s->mutable_data_ptr();
    if (ptr.get_deleter() == &borrowedFlagosStorage) {
      s->set_data_ptr_noswap(exportDataPtr(static_cast<c10::StorageImpl*>(ptr.get_context()), ptr.device()));
      registerExport(s);
      s->set_allocator(&g_export_allocator);
    }
    return; // refcounting frees it
  }
  // The borrowed pointer stays until the next take() replaces it: its
  // deleter does nothing, and nothing reaches a pooled alias meanwhile.
  giveAlias(pool, std::move(impl), s->data_ptr().device());
}

bool relabelIfSoleOwner(at::Tensor& t, c10::DeviceIndex index) {
  const auto& ptr = t.getIntrusivePtr();
  if (ptr.use_count() != 1 || ptr.weak_use_count() != 1 || !t.has_storage() || t.storage().use_count() != 1) {
    return false;
  }
  const CallConstants& c = callConstants();
  const c10::Device label(c10::DeviceType::PrivateUse1, index);
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->mutable_data_ptr().unsafe_set_device(label);
  storage->set_allocator(c.allocator);
  AliasImpl::relabelAsFlagos(*t.unsafeGetTensorImpl(), label, c);
  return true;
}

} // namespace flagos::detail
