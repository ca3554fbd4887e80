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

// --- Products of a few rows (decode steps, verifies) on bf16 weights: stream each weight once -----
//
// oneDNN's bf16 product of a few rows reads the weights below a core's memory bandwidth and does
// not overlap that reading with its arithmetic (docs/performance.md §9). This kernel reads the
// weights in one sequential stream, in the layout `vdpbf16ps` takes (VNNI: 16 outputs × 2 inputs per
// 64-byte vector, [out/16, in/2, 32]), prefetched kAhead vectors ahead, and multiplies each
// vector with all M ≤ kSmallRows input rows while it sits in a register: M accumulators of 16
// outputs, fp32 sums of bf16 products over the input pairs in order — the same sum whatever M is —
// then bf16 rounding of the output as oneDNN's bf16 product does.
constexpr int64_t kSmallRows = 16;  // at most this many input rows take the kernel (more: oneDNN)
constexpr int64_t kAhead = 64;      // weight vectors prefetched ahead

bool small_gemm_cpu() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return ok;
}

#define RS_ATTN_TARGET __attribute__((target("avx512f")))
#define RS_BF16_TARGET __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl")))

// y [M, out] = x [M, in] · Wᵀ for output block `block` (16 outputs); W in VNNI layout.
template <int M>
RS_BF16_TARGET void vnni_block(const uint16_t* x, int64_t in, const uint16_t* w, int64_t block, float* y,
                               int64_t out) {
  const int64_t pairs = in / 2;
  __m512 acc[M];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  const uint16_t* wb = w + block * pairs * 32;
  for (int64_t p = 0; p < pairs; ++p) {
    _mm_prefetch(reinterpret_cast<const char*>(wb + (p + kAhead) * 32), _MM_HINT_T0);  // never faults
    const __m512bh wv = (__m512bh)_mm512_loadu_si512(wb + p * 32);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * in + 2 * p, 4);
      acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(pair), wv);
    }
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(y + m * out + block * 16, acc[m]);
}

template <int M>
void vnni_rows(const uint16_t* x, int64_t in, const uint16_t* w, int64_t out, float* y) {
  for (int64_t block = 0; block < out / 16; ++block) vnni_block<M>(x, in, w, block, y, out);
}

// y [M, out] (fp32, not rounded) = x [M, in] (bf16) · Wᵀ, W bf16 in VNNI layout, 1 ≤ M ≤ kSmallRows.
void small_gemm_kernel(const uint16_t* x, int64_t M, const uint16_t* w, int64_t in, int64_t out, float* y) {
  switch (M) {
#define RS_ROWS(m) \
  case m:          \
    return vnni_rows<m>(x, in, w, out, y);
    RS_ROWS(1) RS_ROWS(2) RS_ROWS(3) RS_ROWS(4) RS_ROWS(5) RS_ROWS(6) RS_ROWS(7) RS_ROWS(8)
    RS_ROWS(9) RS_ROWS(10) RS_ROWS(11) RS_ROWS(12) RS_ROWS(13) RS_ROWS(14) RS_ROWS(15) RS_ROWS(16)
#undef RS_ROWS
    default:
      TORCH_CHECK(false, "the few-row kernel takes 1 to ", kSmallRows, " rows, not ", M);
  }
}

// --- Vector helpers (AVX-512): exp, bf16 rounding ---------------------------------------------
//
// The fused path's elementwise work (SiLU's and softmax's exp, rounding a product's inputs and
// outputs to bf16) in scalar loops cost as much as a verify's attention and glue did in ATen.
#define RS_VEC_TARGET __attribute__((target("avx512f,avx512bw,avx512vl")))

// exp of 16 floats: Cody-Waite reduction by ln 2, Cephes' degree-6 polynomial, scaled by 2ⁿ;
// within 2 ulp of std::exp on [-87, 88], 0 / inf beyond, NaN kept.
RS_VEC_TARGET inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(88.7f), _mm512_max_ps(_mm512_set1_ps(-103.9f), x));  // NaN passes
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// The bits of 16 floats rounded to bf16 (round to nearest even, NaN kept quiet: torch's rounding),
// still in the upper halves of 32-bit lanes.
RS_VEC_TARGET inline __m512i round_bf16_bits(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(odd, _mm512_set1_epi32(0x7fff)));
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                                _mm512_set1_epi32(0x7f800000));
  const __m512i quiet = _mm512_or_si512(u, _mm512_set1_epi32(0x400000));
  return _mm512_and_si512(_mm512_mask_mov_epi32(rounded, nan, quiet), _mm512_set1_epi32(0xffff0000));
}

RS_VEC_TARGET inline __mmask16 lanes(int64_t left) {  // the first min(left, 16) lanes
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1);
}

// out [n] = bf16(x [n]).
RS_VEC_TARGET void to_bf16_rows(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512i bits = _mm512_srli_epi32(round_bf16_bits(_mm512_maskz_loadu_ps(m, x + i)), 16);
    _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(bits));
  }
}

// y [n] = float(bf16(y [n])) in place.
RS_VEC_TARGET void round_to_bf16(float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(round_bf16_bits(_mm512_maskz_loadu_ps(m, y + i))));
  }
}

// y [n] = float(b [n]) for bf16 b.
RS_VEC_TARGET void from_bf16_rows(const uint16_t* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b + i));
    _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
}

// act [I] = silu(gate [I]) · up [I] (SiLU · up of the MLP).
RS_VEC_TARGET void silu_mul(const float* gate, const float* up, int64_t I, float* act) {
  for (int64_t i = 0; i < I; i += 16) {
    const __mmask16 m = lanes(I - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(act + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

// p [S] = exp(p [S] − top); returns their sum (softmax's numerator and denominator).
RS_VEC_TARGET float exp_shifted(float* p, int64_t S, float top) {
  __m512 total = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; s += 16) {
    const __mmask16 m = lanes(S - s);
    const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + s), _mm512_set1_ps(top))));
    _mm512_mask_storeu_ps(p + s, m, e);
    total = _mm512_add_ps(total, e);
  }
  return _mm512_reduce_add_ps(total);
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
    const float total = exp_shifted(p.data(), S, top);
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

// Whether x [..., in] times bf16 weights in VNNI layout [out/16, in/2, 32] can take the kernel.
bool small_gemm_fits(const at::Tensor& x, const at::Tensor& vnni) {
  const int64_t in = 2 * vnni.size(1);
  return small_gemm_cpu() && x.size(-1) == in && x.numel() / in <= kSmallRows && x.numel() > 0;
}

// x float32 [..., in] · W bf16ᵀ (+ bias), W in VNNI layout -> float32 [..., out], rounded to bf16.
at::Tensor small_gemm(const at::Tensor& x, const at::Tensor& vnni, const MaybeTensor& bias) {
  const int64_t in = 2 * vnni.size(1), out = 16 * vnni.size(0), M = x.numel() / in;
  auto xb = x.reshape({M, in}).to(at::kBFloat16).contiguous();
  auto y = at::empty({M, out}, x.options().dtype(at::kFloat));
  small_gemm_kernel(reinterpret_cast<const uint16_t*>(xb.data_ptr()), M,
                    reinterpret_cast<const uint16_t*>(vnni.data_ptr()), in, out, y.data_ptr<float>());
  if (bias.has_value()) y.add_(bias->to(at::kFloat));
  auto shape = x.sizes().vec();
  shape.back() = out;
  return y.to(at::kBFloat16).to(at::kFloat).view(shape);
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
  MaybeTensor vnni;    // bf16 [out/16, in/2, 32] (VNNI layout) where the few-row kernel may run

  at::Tensor operator()(const at::Tensor& x) const {
    if (vnni.has_value() && small_gemm_fits(x, *vnni)) return small_gemm(x, *vnni, bias);
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

// --- One sequence's forward, fused: a few new tokens through every layer on raw floats ----------
//
// With one sequence and a few new tokens (a decode step, a verify, a short prefill) every operator
// between the products touches a few thousand floats, and ATen's dispatch and allocation cost more
// than the arithmetic. This path does them in plain loops (RMSNorm, rotary, the cache write, causal
// attention, SiLU · up, the residual adds) around the products — the few-row kernel up to
// kSmallRows rows, oneDNN's blocked product past it, on the same bf16-rounded inputs — for
// bias-free layers whose products all have bf16 weights in VNNI layout. The same formulas as the ATen
// path; float32 rounding differs (RMSNorm's sum of squares, exp, softmax's order), so its numbers
// match the other path's to float32 rounding, not bit for bit (tests/test_native.py).
constexpr int64_t kFusedRows = 64;  // at most this many new tokens run fused (longer: ATen's operators)

std::atomic<int64_t> fused_steps{0};  // forwards that took the fused path (tests, diagnostics)

struct Scratch {
  std::vector<uint16_t> xb;
  std::vector<float> h, qkv, attn, gate_up, act, out, scores;
};

// y [T, out] = bf16(bf16(x [T, in]) · Wᵀ) for `lin`: the few-row kernel on its VNNI copy up
// to kSmallRows rows, else oneDNN's product on its blocked ones (what Linear runs for T rows).
void product_rows(const float* x, int64_t T, const Linear& lin, float* y, Scratch& s) {
  const at::Tensor& vnni = *lin.vnni;
  const int64_t in = 2 * vnni.size(1), out = 16 * vnni.size(0);
  s.xb.resize(T * in);
  to_bf16_rows(x, T * in, s.xb.data());
  if (T <= kSmallRows) {
    small_gemm_kernel(s.xb.data(), T, reinterpret_cast<const uint16_t*>(vnni.data_ptr()), in, out, y);
    round_to_bf16(y, T * out);
    return;
  }
  auto xb = at::from_blob(s.xb.data(), {T, in}, at::TensorOptions().dtype(at::kBFloat16));
  auto yb = onednn_product(xb, lin.weight, lin.bias).contiguous();  // bf16 [T, out]
  const auto* yp = reinterpret_cast<const uint16_t*>(yb.data_ptr());
  from_bf16_rows(yp, T * out, y);
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

// Whether the fused path takes this call: one sequence, at most kFusedRows new tokens seeing the
// cache and themselves causally (one token without a mask, or `causal` saying the mask is the plain
// causal one), bias-free layers with bf16 weights in VNNI layout on every product, float32 caches.
bool fused_fits(const at::Tensor& x, const std::vector<MaybeTensor>& params, const std::vector<at::Tensor>& keys,
                const MaybeTensor& mask, bool causal, const Geometry& g) {
  const int64_t T = x.size(1);
  if (!g.own || x.size(0) != 1 || T > kFusedRows || g.head_dim % 16 != 0) return false;
  if (mask.has_value() ? !causal : T != 1) return false;
  if (!small_gemm_cpu() || x.scalar_type() != at::kFloat) return false;
  for (size_t l = 0; l < keys.size(); ++l) {
    const auto* p = &params[kPerLayer * l];
    for (size_t j = 0; j < 4; ++j) {
      const auto* lin = p + 2 + j * kPerLinear;
      if (lin[1].has_value() || lin[2].has_value() || !lin[3].has_value()) return false;  // bias, int8, no VNNI copy
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
  for (int64_t t = 0; t < T; ++t) attend_row(qkv + t * Q, keys, values, 0, past + t + 1, Hq, out + t * Hq * D, s.scores);
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
    s.qkv.resize(T * 16 * qkv_w.vnni->size(0));
    product_rows(h, T, qkv_w, s.qkv.data(), s);
    attention_rows(s.qkv.data(), T, keys[l], values[l], past[l], c.data_ptr<float>(), sn.data_ptr<float>(), g,
                   s.attn.data(), s);
    product_rows(s.attn.data(), T, o_w, s.out.data(), s);
    for (int64_t i = 0; i < T * H; ++i) r[i] += s.out[i];
    for (int64_t t = 0; t < T; ++t) rms_norm1(r + t * H, *p[1], g.eps, H, s.h.data() + t * H);
    const int64_t I = 8 * gu_w.vnni->size(0);
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
  if (fuse && fused_fits(x, params, keys, mask, causal, g)) {
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

// The few-row product alone (engine/packed.py PackedLinear calls it; None-able bias).
at::Tensor small_product(const at::Tensor& x, const at::Tensor& vnni, const MaybeTensor& bias) {
  TORCH_CHECK(small_gemm_fits(x, vnni), "the few-row kernel does not take this product");
  pybind11::gil_scoped_release no_gil;
  return small_gemm(x, vnni, bias);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("run_layers", &run_layers, "relaxspec's packed decoder layers (engine/packed.py)");
  m.def("small_product", &small_product, "x · Wᵀ (+ bias) for at most small_rows() rows, bf16 W in VNNI layout");
  m.def("small_product_cpu", &small_gemm_cpu, "whether this CPU runs the few-row kernel");
  m.def("attend", [](const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const MaybeTensor& mask,
                     bool gqa) {
    pybind11::gil_scoped_release no_gil;
    return attend(q, k, v, mask, gqa);
  }, "PackedLayers' attention: the decode kernel where it fits, else torch's");
  m.def("small_rows", []() { return kSmallRows; }, "the most input rows the few-row kernel takes");
  m.def("fused_steps", []() { return fused_steps.load(); }, "forwards run fused so far");
}
