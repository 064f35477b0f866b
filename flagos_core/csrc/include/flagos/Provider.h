#pragma once

// Kernel providers: each serves ATen overloads routed to it by the router.

#include <flagos/Export.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <memory>
#include <string>
#include <vector>

namespace flagos {

using Stack = std::vector<c10::IValue>;

// What the router knows about one overload.
struct OpSlotInfo {
  size_t slot;
  // PyTorch's `device_check: ExactSame`: every tensor argument on one device.
  bool exact_device;
  // Some argument is written (in-place / out=): resizes must be carried back.
  // Also set for the few kernels that compare their arguments' storages
  // (`equal`): aliases of one flagos storage then share one native storage.
  bool writes;
  // Some argument is a Generator?.
  bool takes_generator;
  // A view op whose native kernel only makes a TensorImpl over the same
  // storage with the input's keys: it runs on flagos tensors as they are.
  bool metadata_only;
};

class RelabelProvider;

class FLAGOS_API KernelProvider {
 public:
  explicit KernelProvider(std::string name) : name_(std::move(name)) {}
  virtual ~KernelProvider() = default;
  const std::string& name() const {
    return name_;
  }
  // Whether `call` can run this overload (asked once per overload).
  virtual bool canServe(const c10::OperatorHandle& op) const = 0;
  // Runs the overload on the boxed stack (arguments in, results out).
  virtual void call(
      const c10::OperatorHandle& op,
      c10::DispatchKeySet keys,
      Stack* stack,
      const OpSlotInfo& info) = 0;
  // Index among registered providers; set by registerProvider.
  int index = -1;
  // Set when this provider is a RelabelProvider: the typed kernels then run
  // its steps without boxing the call.
  RelabelProvider* relabel() const {
    return relabel_;
  }

 protected:
  RelabelProvider* relabel_ = nullptr;

 private:
  std::string name_;
};

// Whether a schema argument is a `Generator?`.
FLAGOS_API bool isOptionalGenerator(const c10::Argument& arg);

FLAGOS_API void registerProvider(std::shared_ptr<KernelProvider> provider);
FLAGOS_API KernelProvider* findProvider(const std::string& name);
FLAGOS_API std::vector<std::string> providerNames();

} // namespace flagos
