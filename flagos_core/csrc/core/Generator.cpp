#include <flagos/Generator.h>

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

void NativeBackedGenerator::set_current_seed(uint64_t seed) {
  native_.set_current_seed(seed);
}
// A CPU generator (the host runtime's) has no offset, but torch pickles and
// copies every non-CPU generator with one: there it reads 0, and setting 0
// changes nothing (the state, restored after it, holds everything).
void NativeBackedGenerator::set_offset(uint64_t offset) {
  if (native_.device().is_cpu() && offset == 0) {
    return;
  }
  native_.set_offset(offset);
}
uint64_t NativeBackedGenerator::get_offset() const {
  return native_.device().is_cpu() ? 0 : native_.get_offset();
}
uint64_t NativeBackedGenerator::current_seed() const {
  return native_.current_seed();
}
uint64_t NativeBackedGenerator::seed() {
  return native_.seed();
}
void NativeBackedGenerator::set_state(const c10::TensorImpl& state) {
  native_.unsafeGetGeneratorImpl()->set_state(state);
}
c10::intrusive_ptr<c10::TensorImpl> NativeBackedGenerator::get_state() const {
  return native_.unsafeGetGeneratorImpl()->get_state();
}
NativeBackedGenerator* NativeBackedGenerator::clone_impl() const {
  return new NativeBackedGenerator(device().index(), native_.clone());
}

} // namespace flagos
