// The decoder-layer loop of relaxspec's packed forward (engine/packed.py PackedLayers.layer) in C++.
//
// Each op below is the ATen op the Python loop calls, with the same arguments in the same order, so
// the numbers are the same bit for bit; what goes is Python's cost per op (a few microseconds each,
// a few hundred ops per decode step). Shapes: x float32 [B, T, hidden]; a layer's KV buffers
// [B, kv_heads, capacity, head_dim] float32, written at positions past .. past + T - 1.
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <optional>
#include <vector>

namespace {

using MaybeTensor = std::optional<at::Tensor>;

// One product as PackedLinear / Int8Linear (engine/packed.py) computes it; float32 [..., out].
struct Linear {
  at::Tensor weight;   // oneDNN-reordered [out, in] (bf16 or fp32), or int8 [out, in]
  MaybeTensor bias;    // in the packed dtype (oneDNN) or float32 (int8)
  MaybeTensor scale;   // bf16 [out] for int8 weights; none for oneDNN

  at::Tensor operator()(const at::Tensor& x) const {
    if (scale.has_value()) {
      auto flat = x.reshape({-1, x.size(-1)}).to(at::kBFloat16);
      auto y = at::_weight_int8pack_mm(flat, weight, *scale).to(at::kFloat);
      if (bias.has_value()) y = y + *bias;
      auto shape = x.sizes().vec();
      shape.back() = weight.size(0);
      return y.view(shape);
    }
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                         .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const MaybeTensor&,
                                           c10::string_view, c10::List<std::optional<at::Scalar>>,
                                           std::optional<c10::string_view>)>();
    auto y = op.call(x.to(weight.scalar_type()), weight, bias, "none",
                     c10::List<std::optional<at::Scalar>>(), "");
    return y.to(at::kFloat);
  }
};

// rms_norm of engine/packed.py: one layer norm over [x ; -x] with the doubled weight.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight2, double eps) {
  const int64_t H = x.size(-1);
  auto both = at::cat({x, -x}, -1);
  return at::layer_norm(both, {2 * H}, weight2, {}, eps).slice(-1, 0, H);
}

// _rotate of engine/packed.py: rotary embedding of x [B, heads, T, D].
at::Tensor rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  auto rotated = at::cat({-x.slice(-1, half), x.slice(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

struct Geometry {
  int64_t heads, kv_heads, head_dim;
  double eps;
};

// PackedLayers._attention: qkv [B, T, (H + 2 Hkv) D] -> [B, T, H D]; writes k/v into the buffers.
at::Tensor attention(const at::Tensor& qkv, const at::Tensor& keys, const at::Tensor& values,
                     int64_t past, const at::Tensor& cos, const at::Tensor& sin,
                     const MaybeTensor& mask, const Geometry& g) {
  const int64_t B = qkv.size(0), T = qkv.size(1), D = g.head_dim;
  auto parts = qkv.split_with_sizes({g.heads * D, g.kv_heads * D, g.kv_heads * D}, -1);
  auto q = rotate(parts[0].view({B, T, g.heads, D}).transpose(1, 2), cos, sin);
  auto k = rotate(parts[1].view({B, T, g.kv_heads, D}).transpose(1, 2), cos, sin);
  auto v = parts[2].view({B, T, g.kv_heads, D}).transpose(1, 2);
  keys.slice(2, past, past + T).copy_(k);
  values.slice(2, past, past + T).copy_(v);
  auto out = at::scaled_dot_product_attention(q, keys.slice(2, 0, past + T),
                                              values.slice(2, 0, past + T), mask, 0.0, false,
                                              std::nullopt, g.kv_heads != g.heads);
  return out.transpose(1, 2).reshape({B, T, g.heads * D});
}

Linear linear_at(const std::vector<MaybeTensor>& p, size_t i) {
  return Linear{*p[i], p[i + 1], p[i + 2]};
}

// The layers on the residual stream x. params: per layer 14 entries,
// [attn_norm?, mlp_norm, then (weight, bias?, scale?) for qkv, o, gate_up, down].
at::Tensor run_layers(at::Tensor x, const std::vector<MaybeTensor>& params,
                      const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                      const std::vector<int64_t>& past, const at::Tensor& cos, const at::Tensor& sin,
                      const MaybeTensor& mask, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      double eps) {
  pybind11::gil_scoped_release no_gil;
  const Geometry g{heads, kv_heads, head_dim, eps};
  TORCH_CHECK(params.size() == 14 * keys.size(), "14 parameters per layer");
  for (size_t l = 0; l < keys.size(); ++l) {
    const auto* p = &params[14 * l];
    std::vector<MaybeTensor> lp(p, p + 14);
    auto h = lp[0].has_value() ? rms_norm(x, *lp[0], g.eps) : x;
    auto qkv = linear_at(lp, 2)(h);
    x = x + linear_at(lp, 5)(attention(qkv, keys[l], values[l], past[l], cos, sin, mask, g));
    h = rms_norm(x, *lp[1], g.eps);
    auto gate_up = linear_at(lp, 8)(h).chunk(2, -1);
    x = x + linear_at(lp, 11)(at::silu(gate_up[0]) * gate_up[1]);
  }
  return x;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run_layers", &run_layers, "relaxspec's packed decoder layers (engine/packed.py)");
}
