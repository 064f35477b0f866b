#pragma once

// A flagos-labelled generator whose state is a native generator (CPU for
// host, CUDA's Philox for flagos_cuda): seeded random ops on flagos give the
// native device's numbers, and native kernels draw from native().

#include <flagos/Export.h>

#include <ATen/core/Generator.h>

namespace flagos {

class FLAGOS_API NativeBackedGenerator final : public c10::GeneratorImpl {
 public:
  NativeBackedGenerator(c10::DeviceIndex index, at::Generator native);

  const at::Generator& native() const {
    return native_;
  }
  // The native generator of `gen` if it is a NativeBackedGenerator, else gen.
  static at::Generator unwrap(const at::Generator& gen);

  void set_current_seed(uint64_t seed) override;
  void set_offset(uint64_t offset) override;
  uint64_t get_offset() const override;
  uint64_t current_seed() const override;
  uint64_t seed() override;
  void set_state(const c10::TensorImpl& state) override;
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override;

 private:
  NativeBackedGenerator* clone_impl() const override;
  at::Generator native_;
};

} // namespace flagos
