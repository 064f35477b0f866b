// torch.distributed collectives on flagos tensors, through the native
// device's communication backend (gloo for the host runtime's CPU memory,
// NCCL for the CUDA plugin's).
//
// Every collective is a c10d:: operator taking a ProcessGroup. PyTorch's own
// PrivateUse1 kernels hand flagos tensors to the group's backend for the
// flagos device, and gloo or NCCL accept only their own device's tensors.
// These kernels replace them: the call's flagos tensors become native aliases
// of the same memory (no copy), the native device's kernel runs, so the
// group's backend does the work in place, and the results come back as the
// caller's own flagos tensors. Operators are served by name, boxed, so every
// collective of the installed torch is covered whatever its signature.

#include "core/Collectives.h"

#include <flagos/Relabel.h>
#include <flagos/Runtime.h>

#include "core/CallConstants.h"
#include "core/StandIns.h"

#include <ATen/core/custom_class.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace flagos {
namespace {

// A collective's stand-ins: native aliases, which hold the memory while
// asynchronous work runs; results give the caller's tensors back
// (collectives return the tensors they wrote).
class Aliases {
 public:
  c10::IValue toNative(const c10::IValue& v) {
    return detail::mapTensors(v, [this](const at::Tensor& t) { return standIns_.toNative(t, nativeAliasOf); });
  }
  at::Tensor original(const at::Tensor& t) const {
    const at::Tensor* callers = standIns_.callersTensor(t);
    return callers ? *callers : t;
  }
  c10::IValue original(const c10::IValue& v) const {
    return detail::mapTensors(v, [this](const at::Tensor& t) { return original(t); });
  }
  std::optional<c10::Device> device() const {
    return standIns_.device();
  }

 private:
  detail::StandIns standIns_;
};

// The native backend's Work, giving the caller's flagos tensors where it
// would give the aliases (result(), the future's value): a DDP communication
// hook, for one, works on what the future holds.
class WorkOnFlagos : public c10d::Work {
 public:
  WorkOnFlagos(c10::intrusive_ptr<c10d::Work> inner, std::shared_ptr<const Aliases> aliases)
      : c10d::Work(-1, inner->retrieveOpType()), inner_(std::move(inner)), aliases_(std::move(aliases)) {}

  bool isCompleted() override {
    return inner_->isCompleted();
  }
  bool isSuccess() const override {
    return inner_->isSuccess();
  }
  std::exception_ptr exception() const override {
    return inner_->exception();
  }
  int sourceRank() const override {
    return inner_->sourceRank();
  }
  std::vector<at::Tensor> result() override {
    std::vector<at::Tensor> out = inner_->result();
    for (at::Tensor& t : out) {
      t = aliases_->original(t);
    }
    return out;
  }
  void synchronize() override {
    inner_->synchronize();
  }
  bool wait(std::chrono::milliseconds timeout) override {
    return inner_->wait(timeout);
  }
  void abort() override {
    inner_->abort();
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!future_) {
      c10::intrusive_ptr<c10::ivalue::Future> inner = inner_->getFuture();
      // On the flagos device: a future of the native device checks that its
      // value's memory is the native device's.
      std::vector<c10::Device> devices;
      if (!inner->devices().empty() && aliases_->device()) {
        devices.push_back(*aliases_->device());
      }
      future_ = c10::make_intrusive<c10::ivalue::Future>(inner->elementType(), std::move(devices));
      inner->addCallback([mapped = future_, aliases = aliases_](c10::ivalue::Future& done) {
        if (done.hasError()) {
          mapped->setError(done.exception_ptr());
        } else {
          mapped->markCompleted(aliases->original(done.value()));
        }
      });
    }
    return future_;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override {
    return inner_->getFutureResult();
  }
  float getDuration() const override {
    return inner_->getDuration();
  }
  uint64_t getSequencenumber() const override {
    return inner_->getSequencenumber();
  }

 private:
  c10::intrusive_ptr<c10d::Work> inner_;
  std::shared_ptr<const Aliases> aliases_;
  std::mutex mutex_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// The group's backend for the native device does a flagos collective. A group
// made for flagos alone (init_process_group() with flagos the accelerator)
// has it only under the flagos device: the same backend is named for the
// native device too. A group with different backends for the two raises.
// The group's backend for a device, or null (torch 2.10 has no query for it
// that does not raise).
c10::intrusive_ptr<c10d::Backend> backendFor(c10d::ProcessGroup& group, c10::DeviceType device) {
  try {
    return group.getBackend(device);
  } catch (const c10::Error&) {
    return {};
  }
}

void useFlagosBackendNatively(c10d::ProcessGroup& group, c10::DeviceType native) {
  c10::intrusive_ptr<c10d::Backend> backend = backendFor(group, c10::DeviceType::PrivateUse1);
  if (!backend) {
    return; // the native kernel names what is missing
  }
  static std::mutex mutex; // groups are shared between threads
  std::lock_guard<std::mutex> lock(mutex);
  c10::intrusive_ptr<c10d::Backend> there = backendFor(group, native);
  if (!there) {
    group.setBackend(native, group.getBackendType(), backend);
    return;
  }
  TORCH_CHECK(
      there.get() == backend.get(), "flagos: collectives on flagos tensors run on the backend of the native device (",
      c10::DeviceTypeName(native, true), "), and process group '", group.getGroupName(), "' has another there (",
      there->getBackendName(), ") than for flagos (", backend->getBackendName(),
      "): name one backend for both, e.g. init_process_group(\"", backend->getBackendName(), "\")");
}

void collective(const c10::OperatorHandle& op, c10::DispatchKeySet /*keys*/, torch::jit::Stack* stack) {
  const detail::CallConstants& c = detail::callConstants();
  const size_t count = op.schema().arguments().size();
  const size_t first = stack->size() - count;
  static const c10::ClassTypePtr groupType = c10::getCustomClassType<c10::intrusive_ptr<c10d::ProcessGroup>>();
  static const c10::ClassTypePtr workType = c10::getCustomClassType<c10::intrusive_ptr<c10d::Work>>();
  auto aliases = std::make_shared<Aliases>();
  for (size_t i = first; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isObject()) { // the group, its reduce op, options
      if (v.type().get() == groupType.get()) {
        useFlagosBackendNatively(*v.toCustomClass<c10d::ProcessGroup>(), c.native_type);
      }
      continue;
    }
    v = aliases->toNative(v);
  }
  c10::OptionalDeviceGuard guard;
  if (auto device = aliases->device()) {
    detail::makeCurrent(c, guard, *device);
  }
  op.redispatchBoxed(c.native_keys, stack);
  const size_t returns = op.schema().returns().size();
  for (size_t i = stack->size() - returns; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isObject() && v.type().get() == workType.get()) {
      // A backend may return no Work for a call that has already synchronised
      // (NCCL without async_op): nothing to wrap then.
      c10::intrusive_ptr<c10d::Work> inner = v.toCustomClass<c10d::Work>();
      if (inner) {
        v = c10::IValue(c10::intrusive_ptr<c10d::Work>(c10::make_intrusive<WorkOnFlagos>(std::move(inner), aliases)));
      }
    } else {
      v = aliases->original(v);
    }
  }
}

bool takesProcessGroup(const c10::FunctionSchema& schema) {
  for (const c10::Argument& a : schema.arguments()) {
    if (a.type()->str().find("c10d.ProcessGroup") != std::string::npos) {
      return true;
    }
  }
  return false;
}

} // namespace

// Registers the kernels above over PyTorch's PrivateUse1 ones, once. PyTorch
// warns (once per process) when a kernel replaces another: these replace
// its on purpose, so the warning is kept from the user.
std::vector<std::string> serveCollectives() {
  static std::vector<std::string> served = [] {
    std::vector<std::string> names;
    struct Quiet : c10::WarningHandler {
      void process(const c10::Warning& /*warning*/) override {}
    } quiet;
    c10::WarningUtils::WarningHandlerGuard guard(&quiet);
    static auto* library = new torch::Library(
        torch::Library::IMPL, "c10d", c10::DispatchKey::PrivateUse1, __FILE__, __LINE__);
    for (const c10::OperatorName& name : c10::Dispatcher::singleton().getAllOpNames()) {
      if (name.name.rfind("c10d::", 0) != 0) {
        continue;
      }
      auto op = c10::Dispatcher::singleton().findOp(name);
      if (!op || !op->hasSchema() || !takesProcessGroup(op->schema())) {
        continue;
      }
      std::string qualified = name.name.substr(6) + (name.overload_name.empty() ? "" : "." + name.overload_name);
      library->impl(qualified.c_str(), torch::CppFunction::makeFromBoxedFunction<&collective>());
      names.push_back(name.name + (name.overload_name.empty() ? "" : "." + name.overload_name));
    }
    return names;
  }();
  return served;
}

} // namespace flagos
