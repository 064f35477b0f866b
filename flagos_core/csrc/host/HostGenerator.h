#pragma once

// The host runtime's generator: a flagos-labelled generator whose state is a
// CPU generator, so seeded random ops on flagos give CPU's numbers.

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>

namespace flagos::host {

class HostGenerator final : public c10::GeneratorImpl {
 public:
  explicit HostGenerator(c10::DeviceIndex index, uint64_t seed = c10::default_rng_seed_val);

  // The CPU generator CPU kernels draw from; shares this generator's state.
  const at::Generator& native() const {
    return native_;
  }

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

 private:
  HostGenerator* clone_impl() const override;
  at::Generator native_;
};

} // namespace flagos::host
