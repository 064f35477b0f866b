// Composite ops that choose their kernel by the tensor's device type take the
// native device's choice on flagos.
//
// PyTorch's batch_norm (through _batch_norm_impl_index, which instance_norm
// calls too), grid_sampler and ctc_loss take cuDNN's kernels only for
// tensors whose device is CUDA. For a flagos tensor they took the other branch, CUDA's own
// kernels, whose results are a rounding step away from native CUDA's. Here
// flagos asks PyTorch's own selection about a native alias of the input, and
// where the native device would take cuDNN, calls that kernel on the flagos
// tensors through the dispatcher: autograd records it as natively (its
// backward is cuDNN's too), and routes apply as to any call. Otherwise the
// composite runs as before. On the host runtime (native device CPU) the
// selection never picks cuDNN, so nothing changes there.

#include <flagos/Relabel.h>

#include "core/RouterInternal.h"

#include <ATen/ATen.h>
#include <ATen/native/GridSamplerUtils.h>
#include <ATen/native/Normalization.h>
#include <ATen/TensorSubclassLikeUtils.h>
#include <ATen/ops/_batch_norm_impl_index_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/ctc_loss_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/dropout_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/grid_sampler_compositeimplicitautograd_dispatch.h>
#include <c10/core/DispatchKeySet.h>
#include <torch/library.h>

#include <initializer_list>
#include <optional>
#include <tuple>

namespace flagos {
namespace {

// Whether the call may take the native device's choice: the active runtime
// relabels for a native device, and every tensor is a plain flagos tensor or
// none. A tensor with any other key (functionalization, a Python subclass,
// a conjugate view) takes the composite, as on the native device it would
// reach the composite through that key.
bool choosesNatively(std::initializer_list<const at::Tensor*> tensors) {
  const c10::DispatchKeySet plain = plainFlagosKeys();
  if (detail::defaultRelabelProvider() == nullptr) {
    return false;
  }
  for (const at::Tensor* t : tensors) {
    if (t->defined() && !plain.isSupersetOf(t->key_set())) {
      return false;
    }
  }
  return true;
}

const at::Tensor& orUndefined(const std::optional<at::Tensor>& t) {
  static const at::Tensor kUndefined;
  return t.has_value() ? *t : kUndefined;
}

// The composite's argument checks, which come before its choice: where one
// fails, the composite runs and raises its own error.
bool batchNormArgumentsValid(
    const at::Tensor& input,
    const at::Tensor& weight,
    const at::Tensor& bias,
    const at::Tensor& running_mean,
    const at::Tensor& running_var,
    bool training) {
  if (input.dim() < 2 || input.sym_numel() == 0) {
    return false;
  }
  const c10::SymInt features = input.sym_size(1);
  for (const at::Tensor* t : {&weight, &bias, &running_mean, &running_var}) {
    if (t->defined() && t->sym_numel() != features) {
      return false;
    }
  }
  return training || (running_mean.defined() && running_var.defined());
}

using BatchNormResult = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, int64_t>;

BatchNormResult batchNormImplIndex(
    const at::Tensor& input,
    const std::optional<at::Tensor>& weight_opt,
    const std::optional<at::Tensor>& bias_opt,
    const std::optional<at::Tensor>& running_mean_opt,
    const std::optional<at::Tensor>& running_var_opt,
    bool training,
    double momentum,
    double eps,
    bool cudnn_enabled) {
  const at::Tensor& weight = orUndefined(weight_opt);
  const at::Tensor& bias = orUndefined(bias_opt);
  const at::Tensor& running_mean = orUndefined(running_mean_opt);
  const at::Tensor& running_var = orUndefined(running_var_opt);
  if (choosesNatively({&input, &weight, &bias, &running_mean, &running_var}) &&
      batchNormArgumentsValid(input, weight, bias, running_mean, running_var, training)) {
    at::native::BatchNormBackend backend;
    {
      // The selection reads the input's device; the other tensors' dtypes
      // and presence only.
      const ScopedNativeAlias native_input(input);
      backend = at::native::_select_batch_norm_backend(
          native_input.get(), weight, bias, running_mean, running_var, training, eps);
    }
    if (backend == at::native::BatchNormBackend::Cudnn) {
      // The composite's cuDNN branch: the layouts cuDNN takes, index 1.
      auto [output, save_mean, save_var, reserve] = at::cudnn_batch_norm(
          input.contiguous(input.suggest_memory_format()), weight.contiguous(), bias.contiguous(),
          running_mean.defined() ? running_mean.contiguous() : running_mean,
          running_var.defined() ? running_var.contiguous() : running_var, training, momentum, eps);
      return BatchNormResult(std::move(output), std::move(save_mean), std::move(save_var), std::move(reserve), 1);
    }
    // MIOpen (a ROCm native device) is not taken here: no flagos runtime has
    // one yet, so the composite's branch for it would go untested.
  }
  return at::compositeimplicitautograd::_batch_norm_impl_index(
      input, weight_opt, bias_opt, running_mean_opt, running_var_opt, training, momentum, eps, cudnn_enabled);
}

at::Tensor gridSampler(
    const at::Tensor& input,
    const at::Tensor& grid,
    int64_t interpolation_mode,
    int64_t padding_mode,
    bool align_corners) {
  using at::native::GridSamplerInterpolation;
  using at::native::GridSamplerPadding;
  if (static_cast<GridSamplerInterpolation>(interpolation_mode) == GridSamplerInterpolation::Bilinear &&
      static_cast<GridSamplerPadding>(padding_mode) == GridSamplerPadding::Zeros && align_corners &&
      choosesNatively({&input, &grid})) {
    bool cudnn = false;
    {
      const ScopedNativeAlias native_input(input);
      const ScopedNativeAlias native_grid(grid);
      cudnn = at::native::cond_cudnn_grid_sampler(native_input.get(), native_grid.get());
    }
    if (cudnn) {
      return at::cudnn_grid_sampler(input, grid);
    }
  }
  return at::compositeimplicitautograd::grid_sampler(input, grid, interpolation_mode, padding_mode, align_corners);
}

// ctc_loss's cuDNN branches. The composite asks `_use_cudnn_ctc_loss` only
// for a CUDA log_probs. With lengths as lists cuDNN takes float32 log_probs
// with int32 targets on the CPU (which its kernel reads on the host; the
// router lets them stay there), blank 0, every input as long as log_probs
// and targets under 256 labels; with lengths as tensors, the overload that
// takes them all on the GPU. Where the native device would take cuDNN,
// flagos computes the losses with `_cudnn_ctc_loss` on the flagos tensors
// and reduces them as the composite does, in the same steps; otherwise the
// composite runs as before.

at::Tensor clampedTargetLengths(c10::IntArrayRef target_lengths, const at::TensorOptions& options) {
  return at::tensor(target_lengths, options).clamp_min(1);
}

at::Tensor clampedTargetLengths(const at::Tensor& target_lengths, const at::TensorOptions&) {
  return target_lengths.clamp_min(1);
}

// The composite's reduction of cuDNN's per-sequence losses (deterministic,
// as the composite asks for them).
template <class Lengths>
at::Tensor cudnnCtcLoss(
    const at::Tensor& log_probs,
    const at::Tensor& targets,
    Lengths input_lengths,
    Lengths target_lengths,
    int64_t blank,
    int64_t reduction,
    bool zero_infinity,
    bool batched) {
  at::Tensor losses = std::get<0>(at::_cudnn_ctc_loss(
      log_probs, targets, input_lengths, target_lengths, blank, /*deterministic=*/true, zero_infinity));
  if (reduction == at::Reduction::Mean) {
    return (losses / clampedTargetLengths(target_lengths, losses.options())).mean();
  }
  if (reduction == at::Reduction::Sum) {
    return losses.sum();
  }
  return batched ? losses : losses.squeeze(0);
}

at::Tensor ctcLoss(
    const at::Tensor& log_probs_in,
    const at::Tensor& targets,
    c10::IntArrayRef input_lengths,
    c10::IntArrayRef target_lengths,
    int64_t blank,
    int64_t reduction,
    bool zero_infinity) {
  if (choosesNatively({&log_probs_in}) && targets.defined() && targets.device().is_cpu() &&
      !at::isTensorSubclassLike(targets)) {
    const bool batched = log_probs_in.dim() == 3;
    bool cudnn = false;
    {
      // The selection sees the batched form, as the composite's; the flagos
      // view is made only where cuDNN is taken (autograd records it).
      const ScopedNativeAlias native(log_probs_in);
      cudnn = native.get().device().is_cuda() &&
          at::_use_cudnn_ctc_loss(
                  batched ? native.get() : native.get().unsqueeze(1), targets, input_lengths, target_lengths, blank);
    }
    if (cudnn) {
      return cudnnCtcLoss(
          batched ? log_probs_in : log_probs_in.unsqueeze(1), targets, input_lengths, target_lengths, blank, reduction,
          zero_infinity, batched);
    }
  }
  return at::compositeimplicitautograd::ctc_loss(
      log_probs_in, targets, input_lengths, target_lengths, blank, reduction, zero_infinity);
}

// With lengths as tensors the composite first asks cuDNN's overload for
// tensors; otherwise, for plain tensors, it reads the lengths into lists on
// the CPU and runs the list overload's code (a C++ call, which the dispatcher
// would not bring to ctcLoss), and so does this.
at::Tensor ctcLossTensorLengths(
    const at::Tensor& log_probs,
    const at::Tensor& targets,
    const at::Tensor& input_lengths,
    const at::Tensor& target_lengths,
    int64_t blank,
    int64_t reduction,
    bool zero_infinity) {
  if (at::areAnyTensorSubclassLike({log_probs, targets, input_lengths, target_lengths})) {
    return at::compositeimplicitautograd::ctc_loss(
        log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity);
  }
  // PyTorch asks cuDNN's tensor overload whatever devices the other tensors
  // are on (its kernel takes CPU targets); flagos ones must be plain to be
  // aliased.
  if (choosesNatively({&log_probs}) && plainFlagosOrOther(targets) && plainFlagosOrOther(input_lengths) &&
      plainFlagosOrOther(target_lengths)) {
    bool cudnn = false;
    {
      const ScopedNativeAlias native_log_probs(log_probs);
      const ScopedNativeAlias native_targets(targets);
      const ScopedNativeAlias native_inputs(input_lengths);
      const ScopedNativeAlias native_labels(target_lengths);
      cudnn = native_log_probs.get().device().is_cuda() &&
          at::_use_cudnn_ctc_loss(
                  native_log_probs.get(), native_targets.get(), native_inputs.get(), native_labels.get(), blank);
    }
    if (cudnn) { // its selection asks for 3-dimensional log_probs: batched
      return cudnnCtcLoss<const at::Tensor&>(
          log_probs, targets, input_lengths, target_lengths, blank, reduction, zero_infinity, true);
    }
  }
  TORCH_CHECK(isIntegralType(input_lengths.scalar_type(), /*includeBool=*/false), "input_lengths must be integral");
  TORCH_CHECK(isIntegralType(target_lengths.scalar_type(), /*includeBool=*/false), "target_lengths must be integral");
  const at::Tensor inputs_on_cpu = input_lengths.to(c10::Device(c10::kCPU), at::kLong).contiguous();
  const at::Tensor labels_on_cpu = target_lengths.to(c10::Device(c10::kCPU), at::kLong).contiguous();
  return ctcLoss(
      log_probs, targets, c10::IntArrayRef(inputs_on_cpu.const_data_ptr<int64_t>(), inputs_on_cpu.numel()),
      c10::IntArrayRef(labels_on_cpu.const_data_ptr<int64_t>(), labels_on_cpu.numel()), blank, reduction,
      zero_infinity);
}

// Whether PyTorch's dropout fuses for the native device's tensors (its
// is_fused_kernel_acceptable, by device type).
bool nativeDropoutFuses() {
  switch (activeRuntime().nativeDeviceType()) {
    case c10::DeviceType::CUDA:
    case c10::DeviceType::XPU:
    case c10::DeviceType::Lazy:
    case c10::DeviceType::PrivateUse1:
      return true;
    default:
      return false;
  }
}

at::Tensor dropout(const at::Tensor& input, double p, bool train) {
  // The composite returns the input itself, multiplies by zero or raises for
  // the other cases, alike for every device.
  if (!train || !(p > 0 && p < 1) || input.sym_numel() == 0 || !choosesNatively({&input}) || nativeDropoutFuses()) {
    return at::compositeimplicitautograd::dropout(input, p, train);
  }
  at::Tensor mask = at::empty_like(input);
  mask.bernoulli_(1 - p);
  mask.div_(1 - p);
  return input.mul(mask);
}

} // namespace
} // namespace flagos

// Both keys: the autograd one outside inference mode, the backend one inside
// (and below autograd); the chosen kernel's own call records autograd.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  m.impl("_batch_norm_impl_index", TORCH_FN(flagos::batchNormImplIndex));
  m.impl("grid_sampler", TORCH_FN(flagos::gridSampler));
  m.impl("ctc_loss.IntList", TORCH_FN(flagos::ctcLoss));
  m.impl("ctc_loss.Tensor", TORCH_FN(flagos::ctcLossTensorLengths));
  m.impl("dropout", TORCH_FN(flagos::dropout));
}
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("_batch_norm_impl_index", TORCH_FN(flagos::batchNormImplIndex));
  m.impl("grid_sampler", TORCH_FN(flagos::gridSampler));
  m.impl("ctc_loss.IntList", TORCH_FN(flagos::ctcLoss));
  m.impl("ctc_loss.Tensor", TORCH_FN(flagos::ctcLossTensorLengths));
  m.impl("dropout", TORCH_FN(flagos::dropout));
}
