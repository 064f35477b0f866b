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
void NativeBackedGenerator::set_offset(uint64_t offset) {
  native_.set_offset(offset);
}
uint64_t NativeBackedGenerator::get_offset() const {
  return native_.get_offset();
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
