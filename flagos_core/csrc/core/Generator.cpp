#include <flagos/Generator.h>

#include <mutex>

namespace flagos {

NativeBackedGenerator::NativeBackedGenerator(c10::DeviceIndex index, at::Generator native)
    : c10::GeneratorImpl(
          c10::Device(c10::DeviceType::PrivateUse1, index),
          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      native_(std::move(native)) {}

at::Generator NativeBackedGenerator::unwrap(const at::Generator& gen) {
  if (auto* wrapped = dynamic_cast<NativeBackedGenerator*>(gen.unsafeGetGeneratorImpl())) {
    return wrapped->native();
  }
  return gen;
}

// Native kernels lock the native generator's mutex while they draw, and
// Python locks this wrapper's; so each call that reads or changes the native
// state takes the native mutex too (always after the wrapper's: no cycle).
void NativeBackedGenerator::set_current_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(native_.unsafeGetGeneratorImpl()->mutex_);
  native_.set_current_seed(seed);
}
// A CPU generator (the host runtime's) has no offset, but torch pickles and
// copies every non-CPU generator with one: there it reads 0, and setting 0
// changes nothing (the state, restored after it, holds everything).
void NativeBackedGenerator::set_offset(uint64_t offset) {
  if (native_.device().is_cpu() && offset == 0) {
    return;
  }
  std::lock_guard<std::mutex> lock(native_.unsafeGetGeneratorImpl()->mutex_);
  native_.set_offset(offset);
}
uint64_t NativeBackedGenerator::get_offset() const {
  if (native_.device().is_cpu()) {
    return 0;
  }
  std::lock_guard<std::mutex> lock(native_.unsafeGetGeneratorImpl()->mutex_);
  return native_.get_offset();
}
uint64_t NativeBackedGenerator::current_seed() const {
  return native_.current_seed();
}
uint64_t NativeBackedGenerator::seed() {
  std::lock_guard<std::mutex> lock(native_.unsafeGetGeneratorImpl()->mutex_);
  return native_.seed();
}
void NativeBackedGenerator::set_state(const c10::TensorImpl& state) {
  std::lock_guard<std::mutex> lock(native_.unsafeGetGeneratorImpl()->mutex_);
  native_.unsafeGetGeneratorImpl()->set_state(state);
}
c10::intrusive_ptr<c10::TensorImpl> NativeBackedGenerator::get_state() const {
  std::lock_guard<std::mutex> lock(native_.unsafeGetGeneratorImpl()->mutex_);
  return native_.unsafeGetGeneratorImpl()->get_state();
}
NativeBackedGenerator* NativeBackedGenerator::clone_impl() const {
  std::lock_guard<std::mutex> lock(native_.unsafeGetGeneratorImpl()->mutex_);
  return new NativeBackedGenerator(device().index(), native_.clone());
}

} // namespace flagos
