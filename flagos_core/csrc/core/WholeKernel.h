#pragma once

// Composite ops run whole on the native device (codegen/whole_ops.txt,
// registered for AutogradPrivateUse1 and PrivateUse1 by the generated
// WholeKernels.cpp).
//
// PyTorch decomposes a composite op such as linear on every device: on
// flagos that made each op of the decomposition a flagos call of its own
// (linear: a transpose, a reshape, mm, a view), each paying the relabel's
// cost. Where no autograd is needed, the op is one relabelled call instead:
// the native device's own composite kernel runs on the native aliases, and
// its ops are native calls. The results are the native device's by
// construction (the same kernels, picked by the native device's own checks).
//
// With autograd (grad mode and a tensor that requires grad, or a
// forward-mode gradient), where the native composite would read a
// requires_grad the aliases lack (sameChoiceWithoutGradState), with tensors
// that are not plain flagos tensors
// (FakeTensor, functionalization, conjugate views, other devices), or while
// a route might be bypassed (detail::wholeCallsOn), the op decomposes on
// flagos as before: its composite kernel, called directly. Inference mode
// skips the autograd keys and reaches the PrivateUse1 registration.

#include "core/TypedKernel.h"

#include <ATen/ops/group_norm_ops.h>
#include <ATen/ops/linear_ops.h>
#include <ATen/ops/matmul_ops.h>
#include <ATen/ops/scaled_dot_product_attention_ops.h>
#include <c10/core/GradMode.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>

#include <optional>
#include <type_traits>

namespace flagos::typed {

namespace whole {

// Whether `t` lets the call run whole: a plain flagos tensor (or none) that
// needs no autograd.
inline bool plainTensor(const at::Tensor& t, bool grad_mode, c10::DispatchKeySet plain) {
  if (!t.defined()) {
    return true;
  }
  if (!plain.isSupersetOf(t.key_set())) {
    return false;
  }
  if (grad_mode && t.requires_grad()) {
    return false;
  }
  // Forward-mode AD has one level, 0 (nested levels are refused by PyTorch).
  return t.unsafeGetTensorImpl()->autograd_meta() == nullptr || !t._fw_grad(/*level=*/0).defined();
}

template <class T>
C10_ALWAYS_INLINE bool plainArgument(const std::remove_reference_t<T>& arg, bool grad_mode, c10::DispatchKeySet plain) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    return plainTensor(arg, grad_mode, plain);
  } else if constexpr (std::is_same_v<D, std::optional<at::Tensor>>) {
    return !arg.has_value() || plainTensor(*arg, grad_mode, plain);
  } else {
    static_assert(
        !std::is_same_v<D, at::TensorList> && !std::is_same_v<D, at::ITensorListRef> &&
            !std::is_same_v<D, c10::List<std::optional<at::Tensor>>>,
        "flagos: whole_ops.txt lists an op with a tensor-list argument; WholeKernel.h does not check lists");
    return true;
  }
}

// Extra conditions of one op: SDPA with dropout draws from the native
// device's generator inside its kernel, so it runs whole only without it.
template <class Op>
struct Condition {
  template <class... A>
  static bool holds(const A&...) {
    return true;
  }
};

template <>
struct Condition<at::_ops::scaled_dot_product_attention> {
  template <class... A>
  static bool holds(const A&... args) {
    return std::get<4>(std::forward_as_tuple(args...)) == 0.0; // dropout_p
  }
};

// Whether argument `arg` is a defined tensor (or optional tensor) for which
// `test` holds; false for other arguments.
template <class T, class Test>
C10_ALWAYS_INLINE bool tensorWhere(const std::remove_reference_t<T>& arg, Test test) {
  using D = std::decay_t<T>;
  if constexpr (std::is_same_v<D, at::Tensor>) {
    return arg.defined() && test(arg);
  } else if constexpr (std::is_same_v<D, std::optional<at::Tensor>>) {
    return arg.has_value() && arg->defined() && test(*arg);
  } else {
    return false;
  }
}

// Whether a batched operand folds into a matrix without a copy, as ATen's
// should_fold tests it: its leading dimensions view as one.
inline bool foldsToMatrix(const at::Tensor& t) {
  if (t.numel() == 0) {
    return true;
  }
  for (int64_t i = 0; i + 2 < t.dim(); ++i) {
    if (t.stride(i) != t.stride(i + 1) * t.size(i + 1)) {
      return false;
    }
  }
  return true;
}

// Whether matmul(a, b) chooses its kernels alike whether or not its
// operands require grad. ATen's matmul reads requires_grad in two places:
// should_fold (a matrix or vector operand that requires grad folds the
// batched one into one product; without it, a batched right operand under
// a matrix stays batched, and a batched left one folds only where its
// leading dimensions view as one), and two 3-d operands of different batch
// sizes, where one of batch 1 that requires grad is squeezed first.
inline bool matmulSameChoice(const at::Tensor& a, const at::Tensor& b) {
  const int64_t da = a.dim();
  const int64_t db = b.dim();
  if (da >= 3 && db <= 2) {
    return !b.requires_grad() || foldsToMatrix(a);
  }
  if (da <= 2 && db >= 3) {
    return !a.requires_grad();
  }
  if (da == 3 && db == 3 && a.size(0) != b.size(0)) {
    return !(a.size(0) == 1 && a.requires_grad()) && !(b.size(0) == 1 && b.requires_grad());
  }
  return true;
}

// PyTorch's composites read requires_grad outside grad mode too, and native
// aliases carry no autograd state. Where an argument requires grad, a call
// runs whole only where the op's choice cannot differ without it:
// GradStateChoice<Op>::same says where. By default, every tensor of 3 or
// more dimensions contiguous.
template <class Op>
struct GradStateChoice {
  template <class... T>
  static bool same(const T&... args) {
    const auto batched_non_contiguous = [](const at::Tensor& t) { return t.dim() >= 3 && !t.is_contiguous(); };
    return !(tensorWhere<T>(args, batched_non_contiguous) || ...);
  }
};

// SDPA's backend checks read requires_grad: none may require it.
template <>
struct GradStateChoice<at::_ops::scaled_dot_product_attention> {
  template <class... T>
  static bool same(const T&...) {
    return false;
  }
};

template <>
struct GradStateChoice<at::_ops::matmul> {
  static bool same(const at::Tensor& a, const at::Tensor& b) {
    return matmulSameChoice(a, b);
  }
};

// linear calls matmul(input, weight.t()) (its fused path for a bias reads
// no requires_grad).
template <>
struct GradStateChoice<at::_ops::linear> {
  static bool same(const at::Tensor& input, const at::Tensor& weight, const std::optional<at::Tensor>&) {
    return matmulSameChoice(input, weight);
  }
};

// Whether the native composite, on aliases without requires_grad, would
// choose as it does on tensors with it.
template <class Op, class... A>
C10_ALWAYS_INLINE bool sameChoiceWithoutGradState(const std::remove_reference_t<A>&... args) {
  const auto requires_grad = [](const at::Tensor& t) { return t.requires_grad(); };
  return !(tensorWhere<A>(args, requires_grad) || ...) || GradStateChoice<Op>::same(args...);
}

// How a call that cannot run whole decomposes: the op's composite kernel,
// called directly.
template <class Op, class Decompose>
struct Decomposition {
  template <class... A>
  static decltype(auto) call(A&&... args) {
    return Decompose::call(std::forward<A>(args)...);
  }
};

// PyTorch's group_norm keeps a channels-last input's memory format for CPU
// and PrivateUse1 tensors, and makes it contiguous for every other device;
// native CUDA's native_group_norm, which flagos-cuda's call reaches, then
// refuses the channels-last input ("Expected X.is_contiguous(memory_format)")
// that native CUDA never gives it. So, where the native device is not the
// CPU, the input goes in as the native device's composite passes it:
// contiguous, through the same recorded copy.
template <class Decompose>
struct Decomposition<at::_ops::group_norm, Decompose> {
  template <class... Rest>
  static at::Tensor call(const at::Tensor& input, Rest&&... rest) {
    if (activeRuntime().nativeDeviceType() != c10::DeviceType::CPU && input.device().type() == c10::DeviceType::PrivateUse1) {
      return Decompose::call(input.contiguous(), std::forward<Rest>(rest)...);
    }
    return Decompose::call(input, std::forward<Rest>(rest)...);
  }
};

} // namespace whole

template <class Op, size_t Slot, class Decompose, class Sig = typename Op::schema>
struct WholeKernel;

template <class Op, size_t Slot, class Decompose, class R, class... A>
struct WholeKernel<Op, Slot, Decompose, R(A...)> {
  using Routed = Kernel<Op, Slot>;

  static R call(c10::DispatchKeySet keys, A... args) {
    const bool grad_mode = c10::GradMode::is_enabled();
    const c10::DispatchKeySet plain = plainFlagosKeys();
    // A Python dispatch mode (make_fx, a logging mode) sees the ops a
    // composite decomposes into, on flagos tensors, as natively; whole, it
    // saw the native kernel's inner calls on native aliases.
    if ((whole::plainArgument<A>(args, grad_mode, plain) && ...) && whole::Condition<Op>::holds(args...) &&
        whole::sameChoiceWithoutGradState<Op, A...>(args...) && detail::wholeCallsOn() &&
        !c10::impl::dispatch_mode_enabled()) {
      return Routed::call(keys, std::forward<A>(args)...);
    }
    return whole::Decomposition<Op, Decompose>::call(std::forward<A>(args)...);
  }
};

// Registers `Op`'s whole kernel for routing slot `Slot` with `m`'s key
// (AutogradPrivateUse1, and PrivateUse1 for calls that skip the autograd
// keys, as in inference mode); `Decompose` calls the op's composite kernel.
template <class Op, size_t Slot, class Decompose>
void registerWhole(torch::Library& m, const char* overload) {
  static const bool made = [] { // once for both keys
    WholeKernel<Op, Slot, Decompose>::Routed::makeOverload();
    return true;
  }();
  (void)made;
  m.impl(overload, torch::CppFunction::makeFromUnboxedFunction(TORCH_FN((WholeKernel<Op, Slot, Decompose>::call))));
}

} // namespace flagos::typed
