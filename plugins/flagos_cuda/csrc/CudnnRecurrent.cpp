// nn.LSTM, nn.GRU and nn.RNN on flagos take cuDNN's RNN where native CUDA
// does.
//
// PyTorch's lstm, gru, rnn_tanh and rnn_relu (composite ops) take cuDNN only
// for tensors whose device is CUDA; for a flagos tensor they stepped through
// the sequence with CUDA's fused cells, one call or more per step, with
// results a rounding step away from native CUDA's. Here, where PyTorch's
// check passes for a native alias of the input, the call is the one native
// CUDA's cuDNN branch makes: _cudnn_rnn on the flagos tensors, through the
// dispatcher, so autograd records it (its backward is cuDNN's too) and the
// results equal native CUDA's.
//
// Two differences from the native branch, both outside the results:
// - nn.RNNBase.flatten_parameters packs CUDA tensors only, so a flagos
//   layer's weights are not in one buffer; _cudnn_rnn then packs them on each
//   call (a copy of the weights), as native CUDA does for unflattened
//   weights. Its warning advises flatten_parameters(), which cannot help on
//   flagos, so that one warning is not passed on (docs/usage.md says this).
// - Training with dropout between layers takes the composite path: cuDNN's
//   dropout draws from a state the native branch keeps in CUDA's own cache.

#include <flagos/Relabel.h>

#include "CudnnRecurrent.h"

#include <ATen/ATen.h>
#include <ATen/ops/gru_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/lstm_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/rnn_relu_compositeimplicitautograd_dispatch.h>
#include <ATen/ops/rnn_tanh_compositeimplicitautograd_dispatch.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace flagos::cuda {
namespace {

// cuDNN's RNN modes (cudnnRNNMode_t), as _cudnn_rnn takes them.
enum class Mode : int64_t { kRelu = 0, kTanh = 1, kLstm = 2, kGru = 3 };

bool plainFlagos(const at::Tensor& t) {
  return t.defined() && plainFlagosKeys().isSupersetOf(t.key_set());
}

// Whether native CUDA would take cuDNN for this call (PyTorch's check, asked
// about a native alias of the input), with every tensor a plain flagos one
// (any other key takes the composite, as it would natively), and no dropout
// to draw (see above).
bool takesCudnn(const at::Tensor& input, at::TensorList hidden, at::TensorList params, double dropout, bool train) {
  if (train && dropout > 0) {
    return false;
  }
  if (!plainFlagos(input)) {
    return false;
  }
  for (const at::Tensor& t : hidden) {
    if (!plainFlagos(t)) {
      return false;
    }
  }
  for (const at::Tensor& t : params) {
    if (!plainFlagos(t)) {
      return false;
    }
  }
  const ScopedNativeAlias native_input(input);
  return at::cudnn_is_acceptable(native_input.get());
}

// Passes on every warning but _cudnn_rnn's advice to flatten the weights.
class WithoutFlattenAdvice final : public c10::WarningHandler {
 public:
  WithoutFlattenAdvice() : previous_(c10::WarningUtils::get_warning_handler()) {}
  void process(const c10::Warning& warning) override {
    if (warning.msg().find("flatten_parameters()") == std::string::npos) {
      previous_->process(warning);
    }
  }

 private:
  c10::WarningHandler* previous_;
};

// What every recurrent overload takes after its input and hidden states.
struct Layers {
  at::TensorList params;
  bool has_biases;
  int64_t num_layers;
  double dropout;
  bool train;
  bool bidirectional;
};

// A layer configuration as cuDNN's weight layout depends on it.
struct LayerShape {
  Mode mode;
  int64_t input_size, hidden_size, proj_size, num_layers;
  bool bidirectional, has_biases;
  bool operator==(const LayerShape& o) const {
    return mode == o.mode && input_size == o.input_size && hidden_size == o.hidden_size &&
        proj_size == o.proj_size && num_layers == o.num_layers && bidirectional == o.bidirectional &&
        has_biases == o.has_biases;
  }
};

// One buffer flatten_parameters() packed: the storage (not kept alive), the
// layer it was packed for, its length in elements, and each weight's place.
struct FlatLayout {
  c10::weak_intrusive_ptr<c10::StorageImpl> storage;
  LayerShape shape;
  int64_t numel;
  std::vector<int64_t> offsets;
  std::vector<std::vector<int64_t>> sizes, strides;
};

class FlatLayouts {
 public:
  void add(FlatLayout layout) {
    std::lock_guard<std::mutex> lock(mutex_);
    layouts_.erase(
        std::remove_if(
            layouts_.begin(), layouts_.end(),
            [&](const FlatLayout& l) {
              return l.storage.expired() || l.storage._unsafe_get_target() == layout.storage._unsafe_get_target();
            }),
        layouts_.end());
    layouts_.push_back(std::move(layout));
  }

  // The packed buffer `params` lie in as recorded for `shape`, or undefined.
  at::Tensor bufferOf(at::TensorList params, const LayerShape& shape) {
    if (params.empty() || !params[0].has_storage()) {
      return {};
    }
    const c10::StorageImpl* storage = params[0].unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl();
    std::lock_guard<std::mutex> lock(mutex_);
    for (const FlatLayout& l : layouts_) {
      if (l.storage._unsafe_get_target() != storage || l.storage.expired()) {
        continue;
      }
      if (!(l.shape == shape) || l.offsets.size() != params.size()) {
        return {};
      }
      for (size_t i = 0; i < params.size(); ++i) {
        const at::Tensor& p = params[i];
        if (!p.has_storage() || p.unsafeGetTensorImpl()->unsafe_storage().unsafeGetStorageImpl() != storage ||
            p.storage_offset() != l.offsets[i] || p.sizes() != c10::IntArrayRef(l.sizes[i]) ||
            p.strides() != c10::IntArrayRef(l.strides[i])) {
          return {};
        }
      }
      // The whole buffer: a view of the weights' storage, outside autograd
      // (_cudnn_rnn takes no gradient for it; the weights get theirs).
      return params[0].detach().as_strided({l.numel}, {1}, 0);
    }
    return {};
  }

 private:
  std::mutex mutex_;
  std::vector<FlatLayout> layouts_;
};

FlatLayouts& flatLayouts() {
  static auto* layouts = new FlatLayouts(); // never destroyed: calls may run at exit
  return *layouts;
}

// The native cuDNN branch's call: hidden states (h, and c for an LSTM), the
// weights as the layer holds them (undefined buffer: _cudnn_rnn packs them),
// no dropout state. Returns (output, hy, cy).
std::tuple<at::Tensor, at::Tensor, at::Tensor> cudnnRnn(
    Mode mode,
    const at::Tensor& input,
    const at::Tensor& hx,
    const at::Tensor& cx,
    const Layers& l,
    bool batch_first,
    c10::IntArrayRef batch_sizes) {
  int64_t hidden_size = hx.size(2);
  int64_t proj_size = 0;
  if (cx.defined() && cx.size(2) != hx.size(2)) { // an LSTM with projections
    hidden_size = cx.size(2);
    proj_size = hx.size(2);
  }
  const int64_t weights_per_layer = (l.has_biases ? 4 : 2) + (proj_size != 0 ? 1 : 0);
  const at::Tensor buffer = flatLayouts().bufferOf(
      l.params,
      {mode, input.size(-1), hidden_size, proj_size, l.num_layers, l.bidirectional, l.has_biases});
  WithoutFlattenAdvice handler;
  const c10::WarningUtils::WarningHandlerGuard guard(&handler);
  auto out = at::_cudnn_rnn(
      input, l.params, weights_per_layer, buffer.defined() ? std::optional<at::Tensor>(buffer) : std::nullopt, hx,
      cx.defined() ? std::optional<at::Tensor>(cx) : std::nullopt, static_cast<int64_t>(mode), hidden_size, proj_size,
      l.num_layers, batch_first, l.dropout, l.train, l.bidirectional, batch_sizes, std::nullopt);
  return {std::move(std::get<0>(out)), std::move(std::get<1>(out)), std::move(std::get<2>(out))};
}

// A packed sequence's batch sizes, a CPU int64 tensor, as the list
// _cudnn_rnn takes.
std::vector<int64_t> batchSizesOf(const at::Tensor& batch_sizes) {
  TORCH_CHECK(batch_sizes.dim() == 1, "batch_sizes tensor should be 1D");
  const at::Tensor sizes = batch_sizes.to(at::kCPU, at::kLong).contiguous();
  const int64_t* data = sizes.const_data_ptr<int64_t>();
  return std::vector<int64_t>(data, data + sizes.numel());
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstmInput(
    const at::Tensor& input,
    at::TensorList hx,
    at::TensorList params,
    bool has_biases,
    int64_t num_layers,
    double dropout,
    bool train,
    bool bidirectional,
    bool batch_first) {
  if (hx.size() == 2 && takesCudnn(input, hx, params, dropout, train)) {
    return cudnnRnn(
        Mode::kLstm, input, hx[0], hx[1], {params, has_biases, num_layers, dropout, train, bidirectional}, batch_first,
        {});
  }
  return at::compositeimplicitautograd::lstm(
      input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> lstmData(
    const at::Tensor& data,
    const at::Tensor& batch_sizes,
    at::TensorList hx,
    at::TensorList params,
    bool has_biases,
    int64_t num_layers,
    double dropout,
    bool train,
    bool bidirectional) {
  if (hx.size() == 2 && takesCudnn(data, hx, params, dropout, train)) {
    return cudnnRnn(
        Mode::kLstm, data, hx[0], hx[1], {params, has_biases, num_layers, dropout, train, bidirectional}, false,
        batchSizesOf(batch_sizes));
  }
  return at::compositeimplicitautograd::lstm(
      data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional);
}

// gru, rnn_tanh and rnn_relu: one hidden state.
template <Mode kMode>
struct OneHidden {
  // The op's composite, either overload (padded or packed) by its arguments.
  template <class... A>
  static std::tuple<at::Tensor, at::Tensor> composite(const A&... args) {
    if constexpr (kMode == Mode::kGru) {
      return at::compositeimplicitautograd::gru(args...);
    } else if constexpr (kMode == Mode::kTanh) {
      return at::compositeimplicitautograd::rnn_tanh(args...);
    } else {
      return at::compositeimplicitautograd::rnn_relu(args...);
    }
  }

  static std::tuple<at::Tensor, at::Tensor> cudnn(
      const at::Tensor& input,
      const at::Tensor& hx,
      const Layers& layers,
      bool batch_first,
      c10::IntArrayRef batch_sizes) {
    auto [output, hy, cy] = cudnnRnn(kMode, input, hx, at::Tensor(), layers, batch_first, batch_sizes);
    return {std::move(output), std::move(hy)};
  }

  static std::tuple<at::Tensor, at::Tensor> input(
      const at::Tensor& input,
      const at::Tensor& hx,
      at::TensorList params,
      bool has_biases,
      int64_t num_layers,
      double dropout,
      bool train,
      bool bidirectional,
      bool batch_first) {
    if (!takesCudnn(input, hx, params, dropout, train)) {
      return composite(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first);
    }
    return cudnn(input, hx, {params, has_biases, num_layers, dropout, train, bidirectional}, batch_first, {});
  }

  static std::tuple<at::Tensor, at::Tensor> data(
      const at::Tensor& data,
      const at::Tensor& batch_sizes,
      const at::Tensor& hx,
      at::TensorList params,
      bool has_biases,
      int64_t num_layers,
      double dropout,
      bool train,
      bool bidirectional) {
    if (!takesCudnn(data, hx, params, dropout, train)) {
      return composite(data, batch_sizes, hx, params, has_biases, num_layers, dropout, train, bidirectional);
    }
    return cudnn(
        data, hx, {params, has_biases, num_layers, dropout, train, bidirectional}, false, batchSizesOf(batch_sizes));
  }
};

void registerRecurrent(torch::Library& m) {
  m.impl("lstm.input", TORCH_FN(lstmInput));
  m.impl("lstm.data", TORCH_FN(lstmData));
  m.impl("gru.input", TORCH_FN(OneHidden<Mode::kGru>::input));
  m.impl("gru.data", TORCH_FN(OneHidden<Mode::kGru>::data));
  m.impl("rnn_tanh.input", TORCH_FN(OneHidden<Mode::kTanh>::input));
  m.impl("rnn_tanh.data", TORCH_FN(OneHidden<Mode::kTanh>::data));
  m.impl("rnn_relu.input", TORCH_FN(OneHidden<Mode::kRelu>::input));
  m.impl("rnn_relu.data", TORCH_FN(OneHidden<Mode::kRelu>::data));
}

} // namespace

void registerFlatWeights(
    const std::vector<at::Tensor>& weights,
    int64_t numel,
    int64_t mode,
    int64_t input_size,
    int64_t hidden_size,
    int64_t proj_size,
    int64_t num_layers,
    bool bidirectional,
    bool has_biases) {
  TORCH_CHECK(!weights.empty() && weights[0].has_storage(), "flagos-cuda: no packed weights to record");
  FlatLayout layout{
      c10::weak_intrusive_ptr<c10::StorageImpl>(weights[0].storage().getWeakStorageImpl()),
      {static_cast<Mode>(mode), input_size, hidden_size, proj_size, num_layers, bidirectional, has_biases},
      numel,
      {},
      {},
      {}};
  for (const at::Tensor& w : weights) {
    TORCH_CHECK(
        w.has_storage() && w.storage().unsafeGetStorageImpl() == weights[0].storage().unsafeGetStorageImpl(),
        "flagos-cuda: packed weights must share one buffer");
    layout.offsets.push_back(w.storage_offset());
    layout.sizes.push_back(w.sizes().vec());
    layout.strides.push_back(w.strides().vec());
  }
  flatLayouts().add(std::move(layout));
}

} // namespace flagos::cuda

// Both keys: the autograd one outside inference mode, the backend one inside;
// _cudnn_rnn's own call records autograd. Registered when the plugin's
// library loads, that is when the cuda runtime activates.
TORCH_LIBRARY_IMPL(aten, AutogradPrivateUse1, m) {
  flagos::cuda::registerRecurrent(m);
}
TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  flagos::cuda::registerRecurrent(m);
}
