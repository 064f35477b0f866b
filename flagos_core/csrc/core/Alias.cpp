#include "core/Alias.h"

#include <flagos/Runtime.h>

#include <c10/util/SmallVector.h>

#include <vector>

namespace flagos::detail {
namespace {

void releaseFlagosStorage(void* ctx) {
  c10::raw::intrusive_ptr::decref(static_cast<c10::StorageImpl*>(ctx));
}

c10::DataPtr aliasDataPtr(c10::StorageImpl* flagos, c10::Device native) {
  c10::raw::intrusive_ptr::incref(flagos);
  return c10::DataPtr(flagos->mutable_data_ptr().get(), flagos, &releaseFlagosStorage, native);
}

// A pooled alias borrows the flagos storage for the call (the caller holds
// the flagos tensor meanwhile): no reference taken. Should a kernel keep the
// alias beyond the call, recycleAlias turns this into an owning DataPtr.
void borrowedFlagosStorage(void*) {}

c10::DataPtr borrowedDataPtr(c10::StorageImpl* flagos, c10::Device native) {
  return c10::DataPtr(flagos->mutable_data_ptr().get(), flagos, &borrowedFlagosStorage, native);
}

// Owns a native storage on behalf of a flagos DataPtr over the same memory.
struct ForeignStorageRef {
  c10::Storage storage;
};

void deleteForeignStorageRef(void* ctx) {
  delete static_cast<ForeignStorageRef*>(ctx);
}

// Alias TensorImpls not in use, per native device, for this thread. Each
// keeps its own StorageImpl; between calls it still holds the last borrowed
// pointer, which is never read and whose deleter does nothing.
class AliasPool {
 public:
  at::Tensor take(c10::Device native) {
    auto& list = freeList(native);
    if (list.empty()) {
      c10::Storage storage(c10::make_intrusive<c10::StorageImpl>(
          c10::StorageImpl::use_byte_size_t(), 0, c10::DataPtr(nullptr, native), c10::GetAllocator(native.type()),
          false));
      return at::Tensor(c10::make_intrusive<c10::TensorImpl>(std::move(storage), keysFor(native), caffe2::TypeMeta()));
    }
    at::Tensor t(std::move(list.back()));
    list.pop_back();
    return t;
  }

  void give(c10::intrusive_ptr<c10::TensorImpl> impl, c10::Device native) {
    auto& list = freeList(native);
    if (list.size() < kMaxPerDevice) {
      list.push_back(std::move(impl));
    }
  }

 private:
  static constexpr size_t kMaxPerDevice = 64;
  std::vector<c10::intrusive_ptr<c10::TensorImpl>>& freeList(c10::Device native) {
    for (auto& entry : lists_) {
      if (entry.first == native) {
        return entry.second;
      }
    }
    lists_.emplace_back(native, std::vector<c10::intrusive_ptr<c10::TensorImpl>>());
    return lists_.back().second;
  }
  c10::SmallVector<std::pair<c10::Device, std::vector<c10::intrusive_ptr<c10::TensorImpl>>>, 2> lists_;
};

AliasPool& threadPool() {
  thread_local AliasPool pool;
  return pool;
}

} // namespace

c10::Storage nativeStorageFor(c10::StorageImpl* flagos, c10::Device native) {
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), flagos->sym_nbytes(), aliasDataPtr(flagos, native),
      c10::GetAllocator(native.type()), flagos->resizable()));
}

std::optional<c10::Storage> aliasedFlagosStorage(const c10::Storage& native) {
  const c10::DataPtr& ptr = native.unsafeGetStorageImpl()->data_ptr();
  if (ptr.get_deleter() != &releaseFlagosStorage && ptr.get_deleter() != &borrowedFlagosStorage) {
    return std::nullopt;
  }
  auto* flagos = static_cast<c10::StorageImpl*>(ptr.get_context());
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
    impl->set_allocator(activeRuntime().allocator());
    return native;
  }
  void* data = impl->mutable_data_ptr().get();
  c10::DataPtr wrapped(data, new ForeignStorageRef{native}, &deleteForeignStorageRef, label);
  return c10::Storage(c10::make_intrusive<c10::StorageImpl>(
      c10::StorageImpl::use_byte_size_t(), impl->sym_nbytes(), std::move(wrapped), nullptr, false));
}

c10::DispatchKeySet keysFor(c10::Device device) {
  return c10::DispatchKeySet(c10::computeDispatchKey(std::nullopt, c10::kStrided, device));
}

void copyGeometry(const c10::TensorImpl& from, c10::TensorImpl& to) {
  // A pooled alias often has the geometry already (the pool is last-in
  // first-out); setting it again would recompute contiguity for nothing.
  if (from.sizes() != to.sizes() || from.strides() != to.strides() ||
      from.storage_offset() != to.storage_offset()) {
    to.set_sizes_and_strides(from.sizes(), from.strides(), from.storage_offset());
  }
  if (from.is_conj() != to.is_conj()) {
    to._set_conj(from.is_conj());
  }
  if (from.is_neg() != to.is_neg()) {
    to._set_neg(from.is_neg());
  }
}

at::Tensor flagosTensorOver(c10::Storage storage, const at::Tensor& geometry) {
  const c10::DispatchKeySet keys = keysFor(storage.device());
  auto impl = c10::make_intrusive<c10::TensorImpl>(std::move(storage), keys, geometry.dtype());
  copyGeometry(*geometry.unsafeGetTensorImpl(), *impl);
  return at::Tensor(std::move(impl));
}

at::Tensor pooledAlias(const at::Tensor& t, c10::Device native, const c10::StorageImpl** made) {
  at::Tensor alias = threadPool().take(native);
  c10::TensorImpl* impl = alias.unsafeGetTensorImpl();
  c10::StorageImpl* storage = impl->storage().unsafeGetStorageImpl();
  c10::StorageImpl* flagos = t.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(borrowedDataPtr(flagos, native));
  storage->set_nbytes(flagos->nbytes());
  if (storage->resizable() != flagos->resizable()) {
    storage->set_resizable(flagos->resizable());
  }
  if (impl->dtype() != t.dtype()) {
    impl->set_storage_and_dtype(impl->storage(), t.dtype()); // same storage; new dtype
  }
  copyGeometry(*t.unsafeGetTensorImpl(), *impl);
  *made = storage;
  return alias;
}

void recycleAlias(at::Tensor&& alias, const c10::StorageImpl* made) {
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
      s->set_data_ptr_noswap(aliasDataPtr(static_cast<c10::StorageImpl*>(ptr.get_context()), ptr.device()));
    }
    return; // refcounting frees it
  }
  // The borrowed pointer stays until the next take() replaces it: its
  // deleter does nothing, and nothing reaches a pooled alias meanwhile.
  threadPool().give(std::move(impl), s->data_ptr().device());
}

bool relabelIfSoleOwner(at::Tensor& t, c10::DeviceIndex index) {
  const auto& ptr = t.getIntrusivePtr();
  if (ptr.use_count() != 1 || ptr.weak_use_count() != 1 || !t.has_storage() || t.storage().use_count() != 1) {
    return false;
  }
  const c10::Device label(c10::DeviceType::PrivateUse1, index);
  c10::StorageImpl* storage = t.storage().unsafeGetStorageImpl();
  storage->mutable_data_ptr().unsafe_set_device(label);
  storage->set_allocator(activeRuntime().allocator());
  c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(t.storage()); // re-reads the device from the storage
  impl->_change_backend_component_keys(label);
  return true;
}

} // namespace flagos::detail
