// The decoder-layer loop of relaxspec's packed forward (engine/packed.py PackedLayers.layer) in C++.
//
// Each op below is the ATen op the Python loop calls, with the same arguments in the same order, so
// the numbers are the same bit for bit; what goes is Python's cost per op (a few microseconds each,
// a few hundred ops per decode step). Shapes: x float32 [B, T, hidden]; a layer's KV buffers
// [B, kv_heads, capacity, head_dim] float32, written at positions past .. past + T - 1.
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include "kernels.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using namespace rs_kernels;
using MaybeTensor = std::optional<at::Tensor>;

at::Tensor decode_attention(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(3);
  auto qc = q.contiguous();
  auto out = at::empty({B, H, 1, D}, q.options());
  std::vector<float> p;
  for (int64_t b = 0; b < B; ++b)
    attend_row(qc.data_ptr<float>() + b * H * D, keys, values, b, keys.size(2), H, out.data_ptr<float>() + b * H * D, p);
  return out;
}

bool decode_attention_fits(const at::Tensor& q, const at::Tensor& keys, const MaybeTensor& mask) {
  return !mask.has_value() && q.size(2) == 1 && q.size(3) % 16 == 0 && q.size(3) <= 256 && small_gemm_cpu() &&
         keys.stride(3) == 1 && q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat;
}

// The attention of PackedLayers._attention: the decode kernel where it fits, else torch's.
at::Tensor attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                  const MaybeTensor& mask, bool gqa) {
  if (decode_attention_fits(q, keys, mask)) return decode_attention(q, keys, values);
  return at::scaled_dot_product_attention(q, keys, values, mask, 0.0, false, std::nullopt, gqa);
}

// Whether x [..., in] times weights in VNNI layout [out/16, in/2, 32] can take the kernel: at most
// kSmallRows rows of bf16 weights (oneDNN's product is as fast past that), any number of int8
// weights' (in chunks of kSmallRows: torch's int8 product is slower at every size).
bool small_gemm_fits(const at::Tensor& x, const at::Tensor& vnni) {
  const int64_t in = 2 * vnni.size(1);
  const bool rows = x.numel() / in <= kSmallRows || vnni.scalar_type() == at::kChar;
  return small_gemm_cpu() && x.size(-1) == in && rows && x.numel() > 0;
}

// The few-row kernel on a VNNI copy: bf16, or int8 with its bf16 scales, kSmallRows rows at a time.
// y [M, out] fp32, not rounded.
void vnni_product(const uint16_t* xb, int64_t M, const at::Tensor& vnni, const MaybeTensor& scale, int64_t in,
                  int64_t out, float* y) {
  for (int64_t m = 0; m < M; m += kSmallRows) {
    const int64_t rows = std::min(kSmallRows, M - m);
    if (vnni.scalar_type() == at::kChar) {
      TORCH_CHECK(scale.has_value() && scale->scalar_type() == at::kBFloat16, "int8 weights need bf16 scales");
      const auto* s = reinterpret_cast<const uint16_t*>(scale->data_ptr());
      small_gemm_kernel(xb + m * in, rows, vnni.data_ptr<int8_t>(), s, in, out, y + m * out);
    } else {
      TORCH_CHECK(vnni.scalar_type() == at::kBFloat16, "the few-row kernel takes bf16 or int8 weights");
      small_gemm_kernel(xb + m * in, rows, reinterpret_cast<const uint16_t*>(vnni.data_ptr()), nullptr, in, out,
                        y + m * out);
    }
  }
}

// y [M, out] += bias (any dtype, [out]) row by row; nothing without one.
void add_bias(float* y, int64_t M, int64_t out, const MaybeTensor& bias) {
  if (!bias.has_value()) return;
  const auto b = bias->to(at::kFloat).contiguous();
  for (int64_t m = 0; m < M; ++m)
    for (int64_t j = 0; j < out; ++j) y[m * out + j] += b.data_ptr<float>()[j];
}

// y [M, out] = x [M, in] · Wᵀ (+ bias) on the few-row kernel, xb = bf16(x), W bf16 or int8 (· scale)
// in VNNI layout; rounded to bf16 as PackedLinear's oneDNN product (bias inside) or Int8Linear's
// (bias after) is. The one place the kernel's rounding and bias order are decided.
void own_product(const uint16_t* xb, int64_t M, const at::Tensor& vnni, const MaybeTensor& bias,
                 const MaybeTensor& scale, int64_t in, int64_t out, float* y) {
  vnni_product(xb, M, vnni, scale, in, out, y);
  const bool int8 = vnni.scalar_type() == at::kChar;
  if (!int8) add_bias(y, M, out, bias);
  round_to_bf16(y, M * out);
  if (int8) add_bias(y, M, out, bias);
}

// x float32 [..., in] · Wᵀ (+ bias) on the few-row kernel (own_product) -> float32 [..., out].
at::Tensor small_gemm(const at::Tensor& x, const at::Tensor& vnni, const MaybeTensor& bias, const MaybeTensor& scale) {
  const int64_t in = 2 * vnni.size(1), out = 16 * vnni.size(0), M = x.numel() / in;
  auto xb = x.reshape({M, in}).to(at::kBFloat16).contiguous();
  auto y = at::empty({M, out}, x.options().dtype(at::kFloat));
  own_product(reinterpret_cast<const uint16_t*>(xb.data_ptr()), M, vnni, bias, scale, in, out, y.data_ptr<float>());
  auto shape = x.sizes().vec();
  shape.back() = out;
  return y.view(shape);
}

// oneDNN's product of x (in the weight's dtype) [..., in] with its reordered weight (+ bias), in
// that dtype: mkldnn::_linear_pointwise, the op PackedLinear calls.
at::Tensor onednn_product(const at::Tensor& x, const at::Tensor& weight, const MaybeTensor& bias) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const MaybeTensor&,
                                         c10::string_view, c10::List<std::optional<at::Scalar>>,
                                         std::optional<c10::string_view>)>();
  return op.call(x, weight, bias, "none", c10::List<std::optional<at::Scalar>>(), "");
}

// One product as PackedLinear / Int8Linear (engine/packed.py) computes it; float32 [..., out].
struct Linear {
  at::Tensor weight;   // oneDNN-reordered [out, in] (bf16 or fp32), or int8 [out, in]
  MaybeTensor bias;    // in the packed dtype (oneDNN) or float32 (int8)
  MaybeTensor scale;   // bf16 [out] for int8 weights; none for oneDNN
  MaybeTensor vnni;    // the weights (bf16 or int8) in VNNI layout where the few-row kernel may run

  at::Tensor operator()(const at::Tensor& x) const {
    if (vnni.has_value() && small_gemm_fits(x, *vnni)) return small_gemm(x, *vnni, bias, scale);
    if (scale.has_value()) {
      auto flat = x.reshape({-1, x.size(-1)}).to(at::kBFloat16);
      auto y = at::_weight_int8pack_mm(flat, weight, *scale).to(at::kFloat);
      if (bias.has_value()) y = y + *bias;
      auto shape = x.sizes().vec();
      shape.back() = weight.size(0);
      return y.view(shape);
    }
    return onednn_product(x.to(weight.scalar_type()), weight, bias).to(at::kFloat);
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
  bool own;  // this module's decode attention where it fits (else torch's everywhere)
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
  auto live_keys = keys.slice(2, 0, past + T), live_values = values.slice(2, 0, past + T);
  const bool gqa = g.kv_heads != g.heads;
  auto out = g.own ? attend(q, live_keys, live_values, mask, gqa)
                   : at::scaled_dot_product_attention(q, live_keys, live_values, mask, 0.0, false,
                                                      std::nullopt, gqa);
  return out.transpose(1, 2).reshape({B, T, g.heads * D});
}

constexpr size_t kPerLinear = 4, kPerLayer = 2 + 4 * kPerLinear;

Linear linear_at(const MaybeTensor* p, size_t i) {
  return Linear{*p[i], p[i + 1], p[i + 2], p[i + 3]};
}

// --- One sequence's forward, fused: up to kFusedRows new tokens through every layer on raw floats --
//
// With one sequence and a few new tokens (a decode step, a verify) every operator between the
// products touches a few thousand floats, and ATen's dispatch and allocation cost more than the
// arithmetic; up to a few hundred (a prefill) the plain loops still measured faster. This path does
// them in plain loops (RMSNorm, rotary, the cache write, causal attention, SiLU · up, the residual
// adds) around the products — the few-row kernel up to kSmallRows rows, oneDNN's blocked product
// past it, on the same bf16-rounded inputs — for bias-free layers whose products all have a VNNI
// copy (bf16, or int8). The same formulas as the ATen path; float32 rounding differs (RMSNorm's sum of squares, exp, softmax's order), so its numbers
// match the other path's to float32 rounding, not bit for bit (tests/test_native.py).
constexpr int64_t kFusedRows = 256;  // at most this many new tokens run fused (longer: ATen's operators)

std::atomic<int64_t> fused_steps{0};  // forwards that took the fused path (tests, diagnostics)

struct Scratch {
  std::vector<uint16_t> xb;
  std::vector<float> h, qkv, attn, gate_up, act, out, scores;
};

// y [T, out] = bf16(x [T, in] · Wᵀ) (+ b) for `lin` on bf16-rounded inputs, as Linear computes it:
// the few-row kernel on its VNNI copy up to kSmallRows rows (any number for int8), else oneDNN's
// product (bf16) or _weight_int8pack_mm (int8 without a VNNI copy).
void product_rows(const float* x, int64_t T, const Linear& lin, float* y, Scratch& s) {
  const int64_t out = lin.weight.size(0), in = lin.weight.size(1);
  const bool int8 = lin.scale.has_value();
  const bool own = lin.vnni.has_value() && (T <= kSmallRows || int8);
  // ATen's kernels get a tensor ATen allocated (aligned as they expect); ours read the scratch
  auto xb = own ? at::Tensor() : at::empty({T, in}, at::TensorOptions().dtype(at::kBFloat16));
  s.xb.resize(own ? T * in : 0);
  auto* xp = own ? s.xb.data() : reinterpret_cast<uint16_t*>(xb.data_ptr());
  to_bf16_rows(x, T * in, xp);
  if (own) {
    own_product(xp, T, *lin.vnni, lin.bias, lin.scale, in, out, y);
    return;
  }
  if (int8) {
    auto yb = at::_weight_int8pack_mm(xb, lin.weight, *lin.scale).contiguous();  // bf16 [T, out]
    from_bf16_rows(reinterpret_cast<const uint16_t*>(yb.data_ptr()), T * out, y);
    add_bias(y, T, out, lin.bias);  // after the rounding, as Int8Linear adds it
    return;
  }
  auto yb = onednn_product(xb, lin.weight, lin.bias).contiguous();  // bf16 [T, out]
  from_bf16_rows(reinterpret_cast<const uint16_t*>(yb.data_ptr()), T * out, y);
}

// Whether the fused path takes this call: one sequence, at most kFusedRows new tokens seeing the
// cache and themselves causally (one token without a mask, or `causal` saying the mask is the plain
// causal one), bias-free layers with a VNNI copy (bf16 or int8) of every product, float32 caches.
bool fused_fits(int64_t B, int64_t T, const std::vector<MaybeTensor>& params, const std::vector<at::Tensor>& keys,
                bool masked, bool causal, const Geometry& g) {
  if (!g.own || B != 1 || T > kFusedRows || g.head_dim % 16 != 0 || g.head_dim > 256 || !small_gemm_cpu())
    return false;
  if (masked ? !causal : T != 1) return false;
  for (size_t l = 0; l < keys.size(); ++l) {
    const auto* p = &params[kPerLayer * l];
    for (size_t j = 0; j < 4; ++j) {
      const auto* lin = p + 2 + j * kPerLinear;
      if (lin[1].has_value() || !lin[3].has_value()) return false;  // a bias, or no VNNI copy
    }
    if (keys[l].size(0) != 1 || keys[l].scalar_type() != at::kFloat || keys[l].stride(3) != 1) return false;
  }
  return true;
}

// The attention block of one layer on T fused rows: qkv [T, (H + 2 Hkv) D] rotated in place, k/v
// written at positions past .. past + T − 1, row t attending causally to the first past + t + 1.
void attention_rows(float* qkv, int64_t T, const at::Tensor& keys, const at::Tensor& values, int64_t past,
                    const float* cos, const float* sin, const Geometry& g, float* out, Scratch& s) {
  const int64_t D = g.head_dim, Hq = g.heads, Hkv = g.kv_heads, Q = (Hq + 2 * Hkv) * D;
  float* kb = keys.data_ptr<float>();
  float* vb = values.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    float* q = qkv + t * Q;
    float* k = q + Hq * D;
    const float* v = k + Hkv * D;
    rotate1(q, Hq, D, cos + t * D, sin + t * D);
    rotate1(k, Hkv, D, cos + t * D, sin + t * D);
    for (int64_t j = 0; j < Hkv; ++j) {
      std::memcpy(kb + j * keys.stride(1) + (past + t) * keys.stride(2), k + j * D, D * sizeof(float));
      std::memcpy(vb + j * values.stride(1) + (past + t) * values.stride(2), v + j * D, D * sizeof(float));
    }
  }
  // Head by head, then row by row: a head's keys and values stay in cache across the T rows.
  s.scores.resize(past + T);
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t j = h * Hkv / Hq;
    const float* kh = kb + j * keys.stride(1);
    const float* vh = vb + j * values.stride(1);
    for (int64_t t = 0; t < T; ++t)
      attend_one(qkv + t * Q + h * D, kh, keys.stride(2), vh, values.stride(2), past + t + 1, D,
                 out + t * Hq * D + h * D, s.scores.data());
  }
}

at::Tensor fused_rows(at::Tensor x, const std::vector<MaybeTensor>& params, const std::vector<at::Tensor>& keys,
                      const std::vector<at::Tensor>& values, const std::vector<int64_t>& past, const at::Tensor& cos,
                      const at::Tensor& sin, const Geometry& g) {
  thread_local Scratch s;
  const int64_t T = x.size(1), H = x.size(2);
  auto out = x.contiguous().clone();
  float* r = out.data_ptr<float>();  // the residual stream [T, H]
  auto c = cos.contiguous(), sn = sin.contiguous();  // [1, 1, T, D]
  s.h.resize(T * H);
  s.out.resize(T * H);
  s.attn.resize(T * g.heads * g.head_dim);
  for (size_t l = 0; l < keys.size(); ++l) {
    const auto* p = &params[kPerLayer * l];
    const Linear qkv_w = linear_at(p, 2), o_w = linear_at(p, 2 + kPerLinear);
    const Linear gu_w = linear_at(p, 2 + 2 * kPerLinear), down_w = linear_at(p, 2 + 3 * kPerLinear);
    const float* h = r;
    if (p[0].has_value()) {
      for (int64_t t = 0; t < T; ++t) rms_norm1(r + t * H, *p[0], g.eps, H, s.h.data() + t * H);
      h = s.h.data();
    }
    s.qkv.resize(T * qkv_w.weight.size(0));
    product_rows(h, T, qkv_w, s.qkv.data(), s);
    attention_rows(s.qkv.data(), T, keys[l], values[l], past[l], c.data_ptr<float>(), sn.data_ptr<float>(), g,
                   s.attn.data(), s);
    product_rows(s.attn.data(), T, o_w, s.out.data(), s);
    for (int64_t i = 0; i < T * H; ++i) r[i] += s.out[i];
    for (int64_t t = 0; t < T; ++t) rms_norm1(r + t * H, *p[1], g.eps, H, s.h.data() + t * H);
    const int64_t I = gu_w.weight.size(0) / 2;
    s.gate_up.resize(T * 2 * I);
    product_rows(s.h.data(), T, gu_w, s.gate_up.data(), s);
    s.act.resize(T * I);
    for (int64_t t = 0; t < T; ++t) silu_mul(&s.gate_up[t * 2 * I], &s.gate_up[t * 2 * I + I], I, &s.act[t * I]);
    product_rows(s.act.data(), T, down_w, s.out.data(), s);
    for (int64_t i = 0; i < T * H; ++i) r[i] += s.out[i];
  }
  return out;
}

// The layers on the residual stream x. params: per layer kPerLayer entries,
// [attn_norm?, mlp_norm, then (weight, bias?, scale?, vnni?) for qkv, o, gate_up, down].
at::Tensor run_layers(at::Tensor x, const std::vector<MaybeTensor>& params,
                      const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                      const std::vector<int64_t>& past, const at::Tensor& cos, const at::Tensor& sin,
                      const MaybeTensor& mask, bool causal, int64_t heads, int64_t kv_heads,
                      int64_t head_dim, double eps, bool own, bool fuse) {
  pybind11::gil_scoped_release no_gil;
  const Geometry g{heads, kv_heads, head_dim, eps, own};
  TORCH_CHECK(params.size() == kPerLayer * keys.size(), "parameters per layer: ", kPerLayer);
  if (fuse && x.scalar_type() == at::kFloat && fused_fits(x.size(0), x.size(1), params, keys, mask.has_value(), causal, g)) {
    ++fused_steps;
    return fused_rows(x, params, keys, values, past, cos, sin, g);
  }
  for (size_t l = 0; l < keys.size(); ++l) {
    const MaybeTensor* lp = &params[kPerLayer * l];
    auto h = lp[0].has_value() ? rms_norm(x, *lp[0], g.eps) : x;
    auto qkv = linear_at(lp, 2)(h);
    auto attended = attention(qkv, keys[l], values[l], past[l], cos, sin, mask, g);
    x = x + linear_at(lp, 2 + kPerLinear)(attended);
    h = rms_norm(x, *lp[1], g.eps);
    auto gate_up = linear_at(lp, 2 + 2 * kPerLinear)(h).chunk(2, -1);
    x = x + linear_at(lp, 2 + 3 * kPerLinear)(at::silu(gate_up[0]) * gate_up[1]);
  }
  return x;
}

// A forward of one sequence end to end, fused, for a model whose whole step fits the fused path
// (engine/packed.py PackedForward.fused): the embedding rows of ids [1, T], the layers
// (fused_rows), the final RMSNorm of every new position and the LM head on the last `keep` — the
// ATen calls around the layers cost more than their arithmetic on a few rows. Returns (logits
// float32 [1, keep, V], normed hidden states float32 [1, T, H]), or nothing where the fused path
// does not take the call (the caller then runs it op by op). head: (weight, bias?, scale?, vnni?).
std::optional<std::tuple<at::Tensor, at::Tensor>> fused_forward(
    const at::Tensor& ids, const at::Tensor& embed, const at::Tensor& norm2, const std::vector<MaybeTensor>& head,
    int64_t keep, const std::vector<MaybeTensor>& params, const std::vector<at::Tensor>& keys,
    const std::vector<at::Tensor>& values, const std::vector<int64_t>& past, const at::Tensor& cos,
    const at::Tensor& sin, int64_t heads, int64_t kv_heads, int64_t head_dim, double eps) {
  pybind11::gil_scoped_release no_gil;
  const Geometry g{heads, kv_heads, head_dim, eps, true};
  const int64_t T = ids.size(1), V = embed.size(0), H = embed.size(1);
  const Linear lm = linear_at(head.data(), 0);
  const bool embed_fits = embed.scalar_type() == at::kBFloat16 || embed.scalar_type() == at::kFloat;
  const bool head_fits = lm.weight.scalar_type() == (lm.scale.has_value() ? at::kChar : at::kBFloat16);
  if (!head_fits || !embed_fits || ids.size(0) != 1 ||
      keep < 1 || keep > T || !fused_fits(1, T, params, keys, T > 1, true, g))
    return std::nullopt;
  TORCH_CHECK(ids.scalar_type() == at::kLong, "token ids must be int64");
  auto x = at::empty({1, T, H}, at::kFloat);
  const auto ids_c = ids.contiguous();
  const auto table = embed.contiguous();
  for (int64_t t = 0; t < T; ++t) {
    const int64_t id = ids_c.data_ptr<int64_t>()[t];
    TORCH_CHECK(id >= 0 && id < V, "token id ", id, " is outside the vocabulary of ", V);
    float* row = x.data_ptr<float>() + t * H;
    if (table.scalar_type() == at::kFloat)
      std::memcpy(row, table.data_ptr<float>() + id * H, H * sizeof(float));
    else
      from_bf16_rows(reinterpret_cast<const uint16_t*>(table.data_ptr()) + id * H, H, row);
  }
  ++fused_steps;
  const auto r = fused_rows(x, params, keys, values, past, cos, sin, g);
  auto hidden = at::empty({1, T, H}, at::kFloat);
  for (int64_t t = 0; t < T; ++t) rms_norm1(r.data_ptr<float>() + t * H, norm2, eps, H, hidden.data_ptr<float>() + t * H);
  auto logits = at::empty({1, keep, lm.weight.size(0)}, at::kFloat);
  thread_local Scratch s;
  product_rows(hidden.data_ptr<float>() + (T - keep) * H, keep, lm, logits.data_ptr<float>(), s);
  return std::make_tuple(logits, hidden);
}

// The few-row product alone (engine/packed.py PackedLinear / Int8Linear call it; None-able bias, scale).
at::Tensor small_product(const at::Tensor& x, const at::Tensor& vnni, const MaybeTensor& bias,
                         const MaybeTensor& scale) {
  TORCH_CHECK(small_gemm_fits(x, vnni), "the few-row kernel does not take this product");
  pybind11::gil_scoped_release no_gil;
  return small_gemm(x, vnni, bias, scale);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run_layers", &run_layers, "relaxspec's packed decoder layers (engine/packed.py)");
  m.def("fused_forward", &fused_forward, "a forward of one sequence end to end, fused (or None)");
  m.def("small_product", &small_product, "x · Wᵀ (+ bias) for at most small_rows() rows, W bf16 or int8 (· scale) in VNNI layout");
  m.def("small_product_cpu", &small_gemm_cpu, "whether this CPU runs the few-row kernel");
  m.def("attend", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaybeTensor& mask,
                     bool gqa) {
    pybind11::gil_scoped_release no_gil;
    return attend(q, k, v, mask, gqa);
  }, "PackedLayers' attention: the decode kernel where it fits, else torch's");
  m.def("small_rows", []() { return kSmallRows; }, "the most input rows the few-row kernel takes");
  m.def("fused_rows", []() { return kFusedRows; }, "the most new tokens a forward runs fused");
  m.def("fused_steps", []() { return fused_steps.load(); }, "forwards run fused so far");
}
