#pragma once

// Storage- and tensor-level pieces of the zero-copy relabel (internal to the
// core): native aliases of flagos memory, flagos tensors over native memory,
// and a per-thread pool of alias TensorImpls so a call makes none.

#include <flagos/Runtime.h>

#include <ATen/Tensor.h>
#include <c10/core/Storage.h>
#include <c10/util/MaybeOwned.h>

#include <optional>

namespace flagos::detail {

// A native storage over a flagos storage's memory (an export); it holds a
// reference on the flagos StorageImpl, so the memory outlives anything a
// kernel keeps, and it follows the flagos storage when that moves
// (followExports). `growable`: a resize may give it memory of its own (a
// Storage argument of one call, whose kernel may resize it as natively);
// otherwise growing it raises, since the flagos tensor would not see it.
c10::Storage nativeStorageFor(c10::StorageImpl* flagos, c10::Device native, bool growable);
// The native storage for as_native and nativeAliasOf: the one a flagos
// storage wraps where it wraps one on `native` (from_native, shared memory),
// else a new export that cannot grow.
c10::Storage exportedStorage(c10::StorageImpl* flagos, c10::Device native);
// After a flagos storage's memory moved (a resize, share_memory_, following
// the native storage it wraps): its exports point at the new memory, with its
// size, as natively all tensors over one storage see it move.
void followExports(c10::StorageImpl* flagos);
// Whether `native` is an alias storage's pointer into `flagos`'s memory.
bool isAliasOf(const c10::DataPtr& native, const c10::StorageImpl* flagos);
// The flagos storage an alias storage points at, if `native` is one.
std::optional<c10::Storage> aliasedFlagosStorage(const c10::Storage& native);
// A flagos-labelled storage over `native`'s memory: relabelled in place when
// `fresh` (made by the kernel just run, seen by nobody), else wrapped.
c10::Storage flagosStorageFor(const c10::Storage& native, c10::DeviceIndex index, bool fresh);
// The allocation behind a flagos storage, as its allocator made it: the
// native storage's DataPtr where flagosStorageFor wrapped one, else its own.
const c10::DataPtr& allocationOf(const c10::Storage& flagos);
// After a kernel gave a native storage over `flagos`'s memory new memory
// (`grown`: an alias or export that a resize grew): `flagos` takes it, so
// every flagos tensor over it and every export sees it, as natively. Where
// `flagos` wraps a native storage (from_native), that storage takes it, as a
// native resize would give it, and `flagos` follows.
void takeGrownMemory(c10::StorageImpl* flagos, c10::StorageImpl* grown);
// After a kernel that took `native`, an export of `flagos`, as a Storage
// argument: if the kernel gave it new memory (set_ growing it), `flagos`
// takes that memory (every flagos tensor over it sees it, as natively), and
// `native` is pointed back into it.
void keepExportOver(c10::StorageImpl* flagos, c10::StorageImpl* native);
// The native storage a flagos storage uses the memory of (from_native, or
// moved by moveOnto), if it uses one.
std::optional<c10::Storage> wrappedStorage(const c10::Storage& flagos);
// Moves a flagos storage onto `target`, host memory of the same size: its
// bytes are copied and the flagos StorageImpl points at target's memory from
// then on, in place, so every flagos tensor over it, and every export, sees
// the new memory (how a storage moves into shared memory). The previous
// allocation lives on with the storage.
void moveOnto(const c10::Storage& flagos, c10::Storage target);
// A new flagos TensorImpl over `storage` with `geometry`'s sizes, strides, dtype.
at::Tensor flagosTensorOver(c10::Storage storage, const at::Tensor& geometry);
c10::DispatchKeySet keysFor(c10::Device device);
// Whether a kernel that wrote through `alias` left it as it was made for
// `original`: over the same memory, with the same sizes, strides and
// offset (a write in place does; an out= resize or a set_ does not).
bool aliasUnchanged(const c10::TensorImpl& alias, const c10::TensorImpl& original);
// Whether `a` and `b` have the same sizes, strides and offset.
bool sameGeometry(const c10::TensorImpl& a, const c10::TensorImpl& b);
void copyGeometry(const c10::TensorImpl& from, c10::TensorImpl& to);

// This thread's pool of alias TensorImpls; nullptr while the thread exits
// (aliases are then made afresh and left to refcounting). A thread-local
// lookup in a shared library is a call into the dynamic linker: a call looks
// the pool up once, not once per alias and again per recycle.
class AliasPool;
AliasPool* threadAliasPool();

// A native alias of flagos tensor `t` for the duration of one call, from
// `pool` (this thread's). It borrows t's storage (no reference taken): the
// caller's tensor outlives the call. `made` receives the alias's StorageImpl.
at::Tensor pooledAlias(AliasPool* pool, const at::Tensor& t, c10::Device native, const c10::StorageImpl** made);
// Back to `pool` once the call is over, if nothing else holds it. One that a
// kernel kept takes an owning reference on the flagos storage and is left to
// refcounting; one whose storage the kernel re-pointed is left as it is.
void recycleAlias(AliasPool* pool, at::Tensor&& alias, const c10::StorageImpl* made);

// Turns a tensor a native kernel just made into a flagos one without a new
// TensorImpl, when this is the only reference to it and to its storage.
// Returns false (and changes nothing) otherwise.
bool relabelIfSoleOwner(at::Tensor& t, c10::DeviceIndex index);

// Raises for a quantized native result, which cannot become a flagos tensor.
void checkNotQuantized(const c10::TensorImpl& impl);

} // namespace flagos::detail
