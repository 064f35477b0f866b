// CPU's autocast policies for flagos tensors: what the host runtime uses, so
// that torch.autocast("flagos") on it casts as torch.autocast("cpu") does and
// the CPU kernels behind it give CPU's results.
//
// ATen/autocast_mode.h keeps CUDA's lists for other backends to reuse, not
// CPU's, so the ops are named here by their policy. Each is registered only
// where the installed PyTorch's own CPU autocast casts it (it has an
// AutocastCPU kernel): an op a release dropped from CPU's lists stays uncast
// on flagos too. tests/test_autocast.py checks that both sets are equal for
// the installed PyTorch, and the casts and results against CPU's.

#include "core/Autocast.h"

#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>
#include <torch/version.h>

namespace flagos {
namespace {

bool castsOnCpu(const char* name, const char* overload) {
  auto op = c10::Dispatcher::singleton().findOp(c10::OperatorName(name, overload));
  return op.has_value() && op->hasKernelForDispatchKey(c10::DispatchKey::AutocastCPU);
}

} // namespace

// OP (and OVERLOAD) with CastPolicy POLICY, for flagos tensors, where CPU's
// autocast casts it.
#define FLAGOS_AS_CPU(OP, POLICY)                 \
  if (castsOnCpu("aten::" #OP, "")) {             \
    KERNEL_PRIVATEUSEONE(OP, POLICY)              \
  }
#define FLAGOS_AS_CPU2(OP, OVERLOAD, POLICY)      \
  if (castsOnCpu("aten::" #OP, #OVERLOAD)) {      \
    KERNEL_PRIVATEUSEONE(OP, OVERLOAD, POLICY)    \
  }

void registerCpuPolicies(torch::Library& m) {
  using namespace at; // the wrappers name ATen's types unqualified

  // To the autocast dtype: matrix products, convolutions, attention.
  FLAGOS_AS_CPU(mm, lower_precision_fp)
  FLAGOS_AS_CPU(bmm, lower_precision_fp)
  FLAGOS_AS_CPU(matmul, lower_precision_fp)
  FLAGOS_AS_CPU(linear, lower_precision_fp)
  FLAGOS_AS_CPU(addmm, lower_precision_fp)
  FLAGOS_AS_CPU(_addmm_activation, lower_precision_fp)
  FLAGOS_AS_CPU(addbmm, lower_precision_fp)
  FLAGOS_AS_CPU(baddbmm, lower_precision_fp)
  FLAGOS_AS_CPU(linalg_vecdot, lower_precision_fp)
  FLAGOS_AS_CPU(conv1d, lower_precision_fp)
  FLAGOS_AS_CPU2(conv1d, padding, lower_precision_fp)
  FLAGOS_AS_CPU(conv2d, lower_precision_fp)
  FLAGOS_AS_CPU2(conv2d, padding, lower_precision_fp)
  FLAGOS_AS_CPU(conv3d, lower_precision_fp)
  FLAGOS_AS_CPU2(conv3d, padding, lower_precision_fp)
  FLAGOS_AS_CPU(conv_transpose1d, lower_precision_fp)
  FLAGOS_AS_CPU2(conv_transpose2d, input, lower_precision_fp)
  FLAGOS_AS_CPU2(conv_transpose3d, input, lower_precision_fp)
  FLAGOS_AS_CPU2(_convolution, deprecated, lower_precision_fp)
  FLAGOS_AS_CPU(conv_tbc, lower_precision_fp)
  FLAGOS_AS_CPU(prelu, lower_precision_fp)
  FLAGOS_AS_CPU(mkldnn_rnn_layer, lower_precision_fp)
  FLAGOS_AS_CPU(scaled_dot_product_attention, lower_precision_fp)
  FLAGOS_AS_CPU(_native_multi_head_attention, lower_precision_fp)

  // To float32: losses.
  FLAGOS_AS_CPU(binary_cross_entropy, fp32)
  FLAGOS_AS_CPU(binary_cross_entropy_with_logits, fp32)
  FLAGOS_AS_CPU(cross_entropy_loss, fp32)
  FLAGOS_AS_CPU(nll_loss, fp32)
  FLAGOS_AS_CPU(nll_loss2d, fp32)
  FLAGOS_AS_CPU(mse_loss, fp32)
  FLAGOS_AS_CPU(l1_loss, fp32)
  FLAGOS_AS_CPU(smooth_l1_loss, fp32)
  FLAGOS_AS_CPU(huber_loss, fp32)
  FLAGOS_AS_CPU(kl_div, fp32)
  FLAGOS_AS_CPU(poisson_nll_loss, fp32)
  FLAGOS_AS_CPU(cosine_embedding_loss, fp32)
  FLAGOS_AS_CPU(hinge_embedding_loss, fp32)
  FLAGOS_AS_CPU(margin_ranking_loss, fp32)
  FLAGOS_AS_CPU(soft_margin_loss, fp32)
  FLAGOS_AS_CPU(triplet_margin_loss, fp32)
  FLAGOS_AS_CPU(multi_margin_loss, fp32)
  FLAGOS_AS_CPU(multilabel_margin_loss, fp32)
  FLAGOS_AS_CPU(multilabel_margin_loss_forward, fp32)
  FLAGOS_AS_CPU2(ctc_loss, IntList, fp32)
  FLAGOS_AS_CPU2(ctc_loss, Tensor, fp32)

  // To float32: pooling, padding, sampling.
  FLAGOS_AS_CPU(avg_pool3d, fp32)
  FLAGOS_AS_CPU(max_pool3d, fp32)
  FLAGOS_AS_CPU(adaptive_avg_pool3d, fp32)
  FLAGOS_AS_CPU(adaptive_max_pool3d, fp32)
  FLAGOS_AS_CPU(fractional_max_pool2d, fp32)
  FLAGOS_AS_CPU(fractional_max_pool3d, fp32)
  FLAGOS_AS_CPU(max_unpool2d, fp32)
  FLAGOS_AS_CPU(max_unpool3d, fp32)
  FLAGOS_AS_CPU(reflection_pad1d, fp32)
  FLAGOS_AS_CPU(reflection_pad2d, fp32)
  FLAGOS_AS_CPU(replication_pad1d, fp32)
  FLAGOS_AS_CPU(replication_pad2d, fp32)
  FLAGOS_AS_CPU(replication_pad3d, fp32)
  FLAGOS_AS_CPU(grid_sampler, fp32)
  FLAGOS_AS_CPU(grid_sampler_2d, fp32)
  FLAGOS_AS_CPU(_grid_sampler_2d_cpu_fallback, fp32)
  FLAGOS_AS_CPU(grid_sampler_3d, fp32)

  // To float32: reductions, statistics, distances, spectra, complex views.
  FLAGOS_AS_CPU(prod, fp32)
  FLAGOS_AS_CPU2(prod, dim_int, fp32)
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13 // later releases dropped named-dimension overloads
  FLAGOS_AS_CPU2(prod, dim_Dimname, fp32)
#endif
  FLAGOS_AS_CPU(quantile, fp32)
  FLAGOS_AS_CPU2(quantile, scalar, fp32)
  FLAGOS_AS_CPU(nanquantile, fp32)
  FLAGOS_AS_CPU2(nanquantile, scalar, fp32)
  FLAGOS_AS_CPU(trace, fp32)
  FLAGOS_AS_CPU(cdist, fp32)
  FLAGOS_AS_CPU(polar, fp32)
  FLAGOS_AS_CPU(view_as_complex, fp32)
  FLAGOS_AS_CPU(stft, fp32)
  FLAGOS_AS_CPU2(stft, center, fp32)
  FLAGOS_AS_CPU(fft_fft, fp32)
  FLAGOS_AS_CPU(fft_ifft, fp32)
  FLAGOS_AS_CPU(fft_fft2, fp32)
  FLAGOS_AS_CPU(fft_ifft2, fp32)
  FLAGOS_AS_CPU(fft_fftn, fp32)
  FLAGOS_AS_CPU(fft_ifftn, fp32)
  FLAGOS_AS_CPU(fft_rfft, fp32)
  FLAGOS_AS_CPU(fft_irfft, fp32)
  FLAGOS_AS_CPU(fft_rfft2, fp32)
  FLAGOS_AS_CPU(fft_irfft2, fp32)
  FLAGOS_AS_CPU(fft_rfftn, fp32)
  FLAGOS_AS_CPU(fft_irfftn, fp32)
  FLAGOS_AS_CPU(fft_hfft, fp32)
  FLAGOS_AS_CPU(fft_ihfft, fp32)
  FLAGOS_AS_CPU(fake_quantize_per_tensor_affine, fp32)

  // To float32: linear algebra.
  FLAGOS_AS_CPU(cholesky, fp32)
  FLAGOS_AS_CPU(cholesky_inverse, fp32)
  FLAGOS_AS_CPU(cholesky_solve, fp32)
  FLAGOS_AS_CPU(inverse, fp32)
  FLAGOS_AS_CPU(pinverse, fp32)
  FLAGOS_AS_CPU(lu_solve, fp32)
  FLAGOS_AS_CPU(_lu_with_info, fp32)
  FLAGOS_AS_CPU(orgqr, fp32)
  FLAGOS_AS_CPU(ormqr, fp32)
  FLAGOS_AS_CPU(geqrf, fp32)
  FLAGOS_AS_CPU(qr, fp32)
  FLAGOS_AS_CPU(svd, fp32)
  FLAGOS_AS_CPU(triangular_solve, fp32)
  FLAGOS_AS_CPU(linalg_cholesky, fp32)
  FLAGOS_AS_CPU(linalg_cholesky_ex, fp32)
  FLAGOS_AS_CPU(linalg_cond, fp32)
  FLAGOS_AS_CPU2(linalg_cond, p_str, fp32)
  FLAGOS_AS_CPU(linalg_matrix_rank, fp32)
  FLAGOS_AS_CPU2(linalg_matrix_rank, tol_tensor, fp32)
  FLAGOS_AS_CPU2(linalg_matrix_rank, atol_rtol_tensor, fp32)
  FLAGOS_AS_CPU2(linalg_matrix_rank, atol_rtol_float, fp32)
  FLAGOS_AS_CPU(linalg_solve, fp32)
  FLAGOS_AS_CPU(linalg_svd, fp32)
  FLAGOS_AS_CPU(linalg_svdvals, fp32)
  FLAGOS_AS_CPU(linalg_eig, fp32)
  FLAGOS_AS_CPU(linalg_eigh, fp32)
  FLAGOS_AS_CPU(linalg_eigvals, fp32)
  FLAGOS_AS_CPU(linalg_eigvalsh, fp32)
  FLAGOS_AS_CPU(linalg_inv, fp32)
  FLAGOS_AS_CPU(linalg_inv_ex, fp32)
  FLAGOS_AS_CPU(linalg_householder_product, fp32)
  FLAGOS_AS_CPU(linalg_tensorinv, fp32)
  FLAGOS_AS_CPU(linalg_tensorsolve, fp32)
  FLAGOS_AS_CPU(linalg_qr, fp32)
  FLAGOS_AS_CPU(linalg_lstsq, fp32)

  // To the widest floating type among the inputs.
  FLAGOS_AS_CPU(cat, promote)
  FLAGOS_AS_CPU(stack, promote)
  FLAGOS_AS_CPU(index_copy, promote)
#if TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR < 13
  FLAGOS_AS_CPU2(index_copy, dimname, promote)
#endif
}

#undef FLAGOS_AS_CPU
#undef FLAGOS_AS_CPU2

} // namespace flagos
