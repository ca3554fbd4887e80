// The decoder-layer loop of relaxspec's packed forward (engine/packed.py PackedLayers.layer) in C++.
//
// Each op below is the ATen op the Python loop calls, with the same arguments in the same order, so
// the numbers are the same bit for bit; what goes is Python's cost per op (a few microseconds each,
// a few hundred ops per decode step). Shapes: x float32 [B, T, hidden]; a layer's KV buffers
// [B, kv_heads, capacity, head_dim] float32, written at positions past .. past + T - 1.
#include <torch/extension.h>

#include <ATen/core/dispatch/Dispatcher.h>

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using MaybeTensor = std::optional<at::Tensor>;

// --- Products of a few rows (decode steps) on bf16 weights: stream each weight once --------------
//
// oneDNN's bf16 product of one row reads the weights below the memory bandwidth a core has
// (docs/performance.md §9). This kernel reads 4 weight rows at a time, prefetched 16 rows ahead,
// and takes the dot products of the M ≤ 4 input rows with them while they sit in L1: fp32
// accumulation of bf16 products (AVX-512 BF16 `vdpbf16ps`), then bf16 rounding of the output as
// oneDNN's bf16 product does. Each output is the same sum in the same order whatever M is. Past 4
// rows (verify forwards) oneDNN's blocked product is faster: a wider register-blocked version of
// this kernel was measured slower there and at M = 1 (docs/performance.md §9).
constexpr int64_t kSmallRows = 4;  // at most this many input rows take the kernel (more: oneDNN is faster)
constexpr int64_t kAhead = 16;      // weight rows prefetched ahead

bool small_gemm_cpu() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return ok;
}

#define RS_ATTN_TARGET __attribute__((target("avx512f")))

__attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl"))) void small_gemm_kernel(
    const uint16_t* x, int64_t M, const uint16_t* w, int64_t in, int64_t out, float* y) {
  for (int64_t r = 0; r < out; r += 4) {
    const uint16_t* w0 = w + r * in;
    const char* ahead = reinterpret_cast<const char*>(w0) + kAhead * in * 2;
    for (int64_t b = 0; b < 4 * in * 2; b += 64) _mm_prefetch(ahead + b, _MM_HINT_T0);  // never faults
    for (int64_t m = 0; m < M; ++m) {
      const uint16_t* xm = x + m * in;
      __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
      __m512 a2 = _mm512_setzero_ps(), a3 = _mm512_setzero_ps();
      for (int64_t i = 0; i < in; i += 32) {
        const __m512bh xv = (__m512bh)_mm512_loadu_si512(xm + i);
        a0 = _mm512_dpbf16_ps(a0, xv, (__m512bh)_mm512_loadu_si512(w0 + i));
        a1 = _mm512_dpbf16_ps(a1, xv, (__m512bh)_mm512_loadu_si512(w0 + in + i));
        a2 = _mm512_dpbf16_ps(a2, xv, (__m512bh)_mm512_loadu_si512(w0 + 2 * in + i));
        a3 = _mm512_dpbf16_ps(a3, xv, (__m512bh)_mm512_loadu_si512(w0 + 3 * in + i));
      }
      float* ym = y + m * out + r;
      ym[0] = _mm512_reduce_add_ps(a0);
      ym[1] = _mm512_reduce_add_ps(a1);
      ym[2] = _mm512_reduce_add_ps(a2);
      ym[3] = _mm512_reduce_add_ps(a3);
    }
  }
}

// --- One new token's attention over the cache (a decode step, no mask) ---------------------------
//
// softmax(q·Kᵀ / √D) · V for q [B, H, 1, D] over keys / values [B, Hkv, S, D] (rows of D floats
// at stride D, heads at any stride: the cache's live prefix), head h reading kv head h·Hkv/H. What
// torch's scaled_dot_product_attention computes, up to float32 summation order, without its
// per-call setup (the largest of a decode step's remaining costs beside the products).
RS_ATTN_TARGET float dot64(const float* a, const float* b, int64_t D) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t d = 0; d < D; d += 16) acc = _mm512_fmadd_ps(_mm512_loadu_ps(a + d), _mm512_loadu_ps(b + d), acc);
  return _mm512_reduce_add_ps(acc);
}

// One sequence: q [H, D] over the first S positions of keys / values (batch row `b` of the cache
// buffers [B, Hkv, capacity, D]) -> out [H, D]; p: scratch for S scores.
RS_ATTN_TARGET void attend_row(const float* q, const at::Tensor& keys, const at::Tensor& values,
                               int64_t b, int64_t S, int64_t H, float* out, std::vector<float>& p) {
  const int64_t Hkv = keys.size(1), D = keys.size(3);
  p.resize(S);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const float* kd = keys.data_ptr<float>() + b * keys.stride(0);
  const float* vd = values.data_ptr<float>() + b * values.stride(0);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h * Hkv / H;
    const float* kh = kd + g * keys.stride(1);
    const float* vh = vd + g * values.stride(1);
    float top = -INFINITY;
    for (int64_t s = 0; s < S; ++s) top = std::max(top, p[s] = dot64(q + h * D, kh + s * keys.stride(2), D) * scale);
    float total = 0.0f;
    for (int64_t s = 0; s < S; ++s) total += (p[s] = std::exp(p[s] - top));
    for (int64_t d = 0; d < D; d += 16) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t s = 0; s < S; ++s)
        acc = _mm512_fmadd_ps(_mm512_set1_ps(p[s]), _mm512_loadu_ps(vh + s * values.stride(2) + d), acc);
      _mm512_storeu_ps(out + h * D + d, _mm512_div_ps(acc, _mm512_set1_ps(total)));
    }
  }
}

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
  return !mask.has_value() && q.size(2) == 1 && q.size(3) % 16 == 0 && small_gemm_cpu() &&
         keys.stride(3) == 1 && q.scalar_type() == at::kFloat && keys.scalar_type() == at::kFloat;
}

// The attention of PackedLayers._attention: the decode kernel where it fits, else torch's.
at::Tensor attend(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                  const MaybeTensor& mask, bool gqa) {
  if (decode_attention_fits(q, keys, mask)) return decode_attention(q, keys, values);
  return at::scaled_dot_product_attention(q, keys, values, mask, 0.0, false, std::nullopt, gqa);
}

// Whether x [..., in] times plain bf16 weights [out, in] can take the kernel.
bool small_gemm_fits(const at::Tensor& x, const at::Tensor& plain) {
  const int64_t in = plain.size(1);
  return small_gemm_cpu() && x.numel() / in <= kSmallRows && in % 32 == 0 && plain.size(0) % 4 == 0;
}

// x float32 [..., in] · plain bf16 [out, in]ᵀ (+ bias) -> float32 [..., out], rounded to bf16.
at::Tensor small_gemm(const at::Tensor& x, const at::Tensor& plain, const MaybeTensor& bias) {
  const int64_t in = plain.size(1), out = plain.size(0), M = x.numel() / in;
  auto xb = x.reshape({M, in}).to(at::kBFloat16).contiguous();
  auto y = at::empty({M, out}, x.options().dtype(at::kFloat));
  small_gemm_kernel(reinterpret_cast<const uint16_t*>(xb.data_ptr()), M,
                    reinterpret_cast<const uint16_t*>(plain.data_ptr()), in, out, y.data_ptr<float>());
  if (bias.has_value()) y.add_(bias->to(at::kFloat));
  auto shape = x.sizes().vec();
  shape.back() = out;
  return y.to(at::kBFloat16).to(at::kFloat).view(shape);
}

// One product as PackedLinear / Int8Linear (engine/packed.py) computes it; float32 [..., out].
struct Linear {
  at::Tensor weight;   // oneDNN-reordered [out, in] (bf16 or fp32), or int8 [out, in]
  MaybeTensor bias;    // in the packed dtype (oneDNN) or float32 (int8)
  MaybeTensor scale;   // bf16 [out] for int8 weights; none for oneDNN
  MaybeTensor plain;   // bf16 [out, in] row-major where the few-row kernel may run

  at::Tensor operator()(const at::Tensor& x) const {
    if (plain.has_value() && small_gemm_fits(x, *plain)) return small_gemm(x, *plain, bias);
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

// --- A decode step of one sequence, fused: one token through every layer on raw floats ----------
//
// With one new token of one sequence every operator between the products touches a few hundred
// floats, and ATen's dispatch and allocation cost more than the arithmetic. This path does them in
// plain loops (RMSNorm, rotary, the cache write, attention, SiLU · up, the residual adds) around the
// few-row products, for bias-free layers whose products all have row-major bf16 weights. The same
// formulas as the ATen path; float32 rounding differs (RMSNorm's sum of squares, exp), so its
// numbers match the other path's to float32 rounding, not bit for bit (tests/test_native.py).
inline uint16_t to_bf16(float f) {  // round to nearest even, as torch converts
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

inline float from_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

std::atomic<int64_t> fused_steps{0};  // decode steps that took the fused path (tests, diagnostics)

struct Scratch {
  std::vector<uint16_t> xb;
  std::vector<float> h, qkv, attn, gate_up, act, out, scores;
};

// y [out] = bf16(W · bf16(x)), W row-major bf16 [out, in]: the few-row kernel on one row.
void product1(const float* x, const at::Tensor& plain, float* y, Scratch& s) {
  const int64_t in = plain.size(1), out = plain.size(0);
  s.xb.resize(in);
  for (int64_t i = 0; i < in; ++i) s.xb[i] = to_bf16(x[i]);
  small_gemm_kernel(s.xb.data(), 1, reinterpret_cast<const uint16_t*>(plain.data_ptr()), in, out, y);
  for (int64_t j = 0; j < out; ++j) y[j] = from_bf16(to_bf16(y[j]));
}

// out = x / sqrt(mean(x²) + eps) · w, with w the first half of the doubled weight (rms_norm).
void rms_norm1(const float* x, const at::Tensor& weight2, double eps, int64_t H, float* out) {
  const float* w = weight2.data_ptr<float>();
  float squares = 0.0f;
  for (int64_t i = 0; i < H; ++i) squares += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(squares / static_cast<float>(H) + static_cast<float>(eps));
  for (int64_t i = 0; i < H; ++i) out[i] = x[i] * scale * w[i];
}

// Rotary of `heads` vectors of D floats in place (_rotate: x · cos + rotate_half(x) · sin).
void rotate1(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < heads; ++h) {
    float* v = x + h * D;
    for (int64_t d = 0; d < half; ++d) {
      const float a = v[d], b = v[d + half];
      v[d] = a * cos[d] - b * sin[d];
      v[d + half] = b * cos[d + half] + a * sin[d + half];
    }
  }
}

// Whether the fused decode step takes this call (one token of one sequence, no mask, bias-free
// layers with every product on the few-row kernel, float32 caches).
bool fused_decode_fits(const at::Tensor& x, const std::vector<MaybeTensor>& params,
                       const std::vector<at::Tensor>& keys, const MaybeTensor& mask, const Geometry& g) {
  if (!g.own || mask.has_value() || x.size(0) != 1 || x.size(1) != 1 || g.head_dim % 16 != 0) return false;
  if (!small_gemm_cpu() || x.scalar_type() != at::kFloat) return false;
  for (size_t l = 0; l < keys.size(); ++l) {
    const auto* p = &params[kPerLayer * l];
    for (size_t j = 0; j < 4; ++j) {
      const auto* lin = p + 2 + j * kPerLinear;
      if (lin[1].has_value() || lin[2].has_value() || !lin[3].has_value()) return false;  // bias, int8, no plain
    }
    if (keys[l].size(0) != 1 || keys[l].scalar_type() != at::kFloat || keys[l].stride(3) != 1) return false;
  }
  return true;
}

at::Tensor fused_decode(at::Tensor x, const std::vector<MaybeTensor>& params,
                        const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                        const std::vector<int64_t>& past, const at::Tensor& cos, const at::Tensor& sin,
                        const Geometry& g) {
  thread_local Scratch s;
  const int64_t H = x.size(2), D = g.head_dim, Hq = g.heads, Hkv = g.kv_heads;
  auto out = x.contiguous().clone();
  float* r = out.data_ptr<float>();  // the residual stream [H]
  auto c = cos.contiguous(), sn = sin.contiguous();
  const float* cp = c.data_ptr<float>();
  const float* sp = sn.data_ptr<float>();
  s.h.resize(H);
  for (size_t l = 0; l < keys.size(); ++l) {
    const auto* p = &params[kPerLayer * l];
    const at::Tensor& qkv_w = *p[2 + 3];
    const at::Tensor& o_w = *p[2 + kPerLinear + 3];
    const at::Tensor& gu_w = *p[2 + 2 * kPerLinear + 3];
    const at::Tensor& down_w = *p[2 + 3 * kPerLinear + 3];
    const float* h = r;
    if (p[0].has_value()) {
      rms_norm1(r, *p[0], g.eps, H, s.h.data());
      h = s.h.data();
    }
    s.qkv.resize(qkv_w.size(0));
    product1(h, qkv_w, s.qkv.data(), s);
    float* q = s.qkv.data();
    float* k = q + Hq * D;
    const float* v = k + Hkv * D;
    rotate1(q, Hq, D, cp, sp);
    rotate1(k, Hkv, D, cp, sp);
    float* kb = keys[l].data_ptr<float>();
    float* vb = values[l].data_ptr<float>();
    for (int64_t j = 0; j < Hkv; ++j) {
      std::memcpy(kb + j * keys[l].stride(1) + past[l] * keys[l].stride(2), k + j * D, D * sizeof(float));
      std::memcpy(vb + j * values[l].stride(1) + past[l] * values[l].stride(2), v + j * D, D * sizeof(float));
    }
    s.attn.resize(Hq * D);
    attend_row(q, keys[l], values[l], 0, past[l] + 1, Hq, s.attn.data(), s.scores);
    s.out.resize(o_w.size(0));
    product1(s.attn.data(), o_w, s.out.data(), s);
    for (int64_t i = 0; i < H; ++i) r[i] += s.out[i];
    rms_norm1(r, *p[1], g.eps, H, s.h.data());
    s.gate_up.resize(gu_w.size(0));
    product1(s.h.data(), gu_w, s.gate_up.data(), s);
    const int64_t I = gu_w.size(0) / 2;
    s.act.resize(I);
    for (int64_t i = 0; i < I; ++i) {
      const float gate = s.gate_up[i];
      s.act[i] = gate / (1.0f + std::exp(-gate)) * s.gate_up[I + i];
    }
    s.out.resize(down_w.size(0));
    product1(s.act.data(), down_w, s.out.data(), s);
    for (int64_t i = 0; i < H; ++i) r[i] += s.out[i];
  }
  return out;
}

// The layers on the residual stream x. params: per layer kPerLayer entries,
// [attn_norm?, mlp_norm, then (weight, bias?, scale?, plain?) for qkv, o, gate_up, down].
at::Tensor run_layers(at::Tensor x, const std::vector<MaybeTensor>& params,
                      const std::vector<at::Tensor>& keys, const std::vector<at::Tensor>& values,
                      const std::vector<int64_t>& past, const at::Tensor& cos, const at::Tensor& sin,
                      const MaybeTensor& mask, int64_t heads, int64_t kv_heads, int64_t head_dim,
                      double eps, bool own, bool fuse) {
  pybind11::gil_scoped_release no_gil;
  const Geometry g{heads, kv_heads, head_dim, eps, own};
  TORCH_CHECK(params.size() == kPerLayer * keys.size(), "parameters per layer: ", kPerLayer);
  if (fuse && fused_decode_fits(x, params, keys, mask, g)) {
    ++fused_steps;
    return fused_decode(x, params, keys, values, past, cos, sin, g);
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

// The few-row product alone (engine/packed.py PackedLinear calls it; None-able bias).
at::Tensor small_product(const at::Tensor& x, const at::Tensor& plain, const MaybeTensor& bias) {
  TORCH_CHECK(small_gemm_fits(x, plain), "the few-row kernel does not take this product");
  pybind11::gil_scoped_release no_gil;
  return small_gemm(x, plain, bias);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run_layers", &run_layers, "relaxspec's packed decoder layers (engine/packed.py)");
  m.def("small_product", &small_product, "x · plainᵀ (+ bias) for at most small_rows() rows, bf16 weights");
  m.def("small_product_cpu", &small_gemm_cpu, "whether this CPU runs the few-row kernel");
  m.def("attend", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaybeTensor& mask,
                     bool gqa) {
    pybind11::gil_scoped_release no_gil;
    return attend(q, k, v, mask, gqa);
  }, "PackedLayers' attention: the decode kernel where it fits, else torch's");
  m.def("small_rows", []() { return kSmallRows; }, "the most input rows the few-row kernel takes");
  m.def("fused_steps", []() { return fused_steps.load(); }, "decode steps run fused so far");
}
