#pragma once

// A boxed call's flagos tensors and the native tensors standing in for them
// (internal to the core): the collectives and nested-tensor kernels run an op
// natively on stand-ins over the same memory, and give each result that is a
// stand-in back as the caller's own flagos tensor. Unlike the router's pooled
// aliases, stand-ins are fresh tensors that a kernel may keep (asynchronous
// collectives do).

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <optional>
#include <utility>
#include <vector>

namespace flagos::detail {

// `f` applied to each tensor of Tensor, Tensor?, Tensor[], Tensor?[] and
// Tensor[][] values; anything else as it is.
template <typename F>
c10::IValue mapTensors(const c10::IValue& v, const F& f) {
  if (v.isTensor()) {
    return f(v.toTensor());
  }
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) {
      out.push_back(f(t));
    }
    return out;
  }
  if (v.isOptionalTensorList()) {
    c10::List<std::optional<at::Tensor>> out;
    for (const std::optional<at::Tensor>& t : v.toOptionalTensorList()) {
      out.push_back(t ? std::optional<at::Tensor>(f(*t)) : std::nullopt);
    }
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    if (list.empty() || !list.get(0).isTensorList()) {
      return v;
    }
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& inner : list) {
      out.push_back(mapTensors(inner, f));
    }
    return out;
  }
  return v;
}

class StandIns {
 public:
  // `make` gives the stand-in of a flagos tensor; other tensors pass as they are.
  template <typename Make>
  at::Tensor toNative(const at::Tensor& t, const Make& make) {
    if (!t.defined() || t.device().type() != c10::DeviceType::PrivateUse1) {
      return t;
    }
    if (!device_) {
      device_ = t.device();
    }
    at::Tensor native = make(t);
    made_.emplace_back(native.unsafeGetTensorImpl(), t);
    return native;
  }

  // The caller's tensor a stand-in stands for, or null.
  const at::Tensor* callersTensor(const at::Tensor& native) const {
    for (const auto& [impl, flagos] : made_) {
      if (impl == native.unsafeGetTensorImpl()) {
        return &flagos;
      }
    }
    return nullptr;
  }

  // The device of the call's first flagos tensor.
  std::optional<c10::Device> device() const {
    return device_;
  }

 private:
  std::vector<std::pair<const c10::TensorImpl*, at::Tensor>> made_;
  std::optional<c10::Device> device_;
};

} // namespace flagos::detail
