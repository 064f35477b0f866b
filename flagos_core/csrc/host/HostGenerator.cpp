#include "host/HostGenerator.h"

namespace flagos::host {

HostGenerator::HostGenerator(c10::DeviceIndex index, uint64_t seed)
    : c10::GeneratorImpl(
          c10::Device(c10::DeviceType::PrivateUse1, index),
          c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
      native_(at::make_generator<at::CPUGeneratorImpl>(seed)) {}

void HostGenerator::set_current_seed(uint64_t seed) {
  native_.set_current_seed(seed);
}
void HostGenerator::set_offset(uint64_t offset) {
  native_.set_offset(offset);
}
uint64_t HostGenerator::get_offset() const {
  return native_.get_offset();
}
uint64_t HostGenerator::current_seed() const {
  return native_.current_seed();
}
uint64_t HostGenerator::seed() {
  return native_.seed();
}
void HostGenerator::set_state(const c10::TensorImpl& state) {
  native_.unsafeGetGeneratorImpl()->set_state(state);
}
c10::intrusive_ptr<c10::TensorImpl> HostGenerator::get_state() const {
  return native_.unsafeGetGeneratorImpl()->get_state();
}
HostGenerator* HostGenerator::clone_impl() const {
  auto* copy = new HostGenerator(device().index());
  copy->native_ = native_.clone();
  return copy;
}

} // namespace flagos::host
