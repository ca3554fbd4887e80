// relaxspec's own CPU kernels on raw pointers (AVX-512, AVX-512 BF16), used by layers.cpp: the
// few-row bf16 product, the vector helpers (exp, bf16 rounding, SiLU · up), one row's attention over
// the cache, RMSNorm and rotary of one vector. Every function here is the arithmetic alone: shapes
// are checked and tensors made by its callers.
#pragma once

#include <torch/extension.h>

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace rs_kernels {

// --- Products of a few rows (decode steps, verifies) on bf16 weights: stream each weight once -----
//
// oneDNN's bf16 product of a few rows reads the weights below a core's memory bandwidth and does
// not overlap that reading with its arithmetic (docs/performance.md §9). This kernel reads the
// weights in one sequential stream, in the layout `vdpbf16ps` takes (VNNI: 16 outputs × 2 inputs per
// 64-byte vector, [out/16, in/2, 32]), prefetched kAhead vectors ahead (non-temporal: each is read
// once per step, so it should not evict what the rest of the step uses), and multiplies each
// vector with all M ≤ kSmallRows input rows while it sits in a register: M accumulators of 16
// outputs, fp32 sums of bf16 products over the input pairs in order — the same sum whatever M is —
// then bf16 rounding of the output as oneDNN's bf16 product does. Weight-only int8 weights (one
// scale per output) stream in the same layout at half the bytes, each converted to bf16 in a register.
constexpr int64_t kSmallRows = 16;  // at most this many input rows take the kernel (more: oneDNN)
constexpr int64_t kAhead = 64;      // weight vectors prefetched ahead

inline bool small_gemm_cpu() {
  static const bool ok = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return ok;
}

#define RS_ATTN_TARGET __attribute__((target("avx512f")))
#define RS_BF16_TARGET __attribute__((target("avx512f,avx512bf16,avx512bw,avx512vl")))

// The 32 weights of one VNNI vector as bf16: bf16 weights as they are; int8 weights converted
// exactly (int8 → int32 → float → bf16: every int8 is a bf16), their scale applied to the sums.
RS_BF16_TARGET inline __m512bh weight_vector(const uint16_t* w) { return (__m512bh)_mm512_loadu_si512(w); }

RS_BF16_TARGET inline __m512bh weight_vector(const int8_t* w) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(q)));
  const __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(q, 1)));
  return _mm512_cvtne2ps_pbh(hi, lo);  // [lo ; hi]: the vector's order
}

// y [M, out] = x [M, in] · Wᵀ (· scale) for output block `block` (16 outputs); W in VNNI layout,
// bf16 or int8 with a bf16 scale per output (nullptr: none).
template <int M, typename W>
RS_BF16_TARGET inline void vnni_block(const uint16_t* x, int64_t in, const W* w, const uint16_t* scale, int64_t block,
                                      float* y, int64_t out) {
  const int64_t pairs = in / 2;
  __m512 acc[M];
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
  const W* wb = w + block * pairs * 32;
  for (int64_t p = 0; p < pairs; ++p) {
    _mm_prefetch(reinterpret_cast<const char*>(wb + (p + kAhead) * 32), _MM_HINT_NTA);  // never faults; read once
    const __m512bh wv = weight_vector(wb + p * 32);
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * in + 2 * p, 4);
      acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(pair), wv);
    }
  }
  if (scale != nullptr) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scale + block * 16));
    const __m512 s = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
#pragma GCC unroll 16
    for (int m = 0; m < M; ++m) acc[m] = _mm512_mul_ps(acc[m], s);
  }
#pragma GCC unroll 16
  for (int m = 0; m < M; ++m) _mm512_storeu_ps(y + m * out + block * 16, acc[m]);
}

template <int M, typename W>
inline void vnni_rows(const uint16_t* x, int64_t in, const W* w, const uint16_t* scale, int64_t out, float* y) {
  for (int64_t block = 0; block < out / 16; ++block) vnni_block<M, W>(x, in, w, scale, block, y, out);
}

// y [M, out] (fp32, not rounded) = x [M, in] (bf16) · Wᵀ (· scale), W bf16 or int8 in VNNI layout,
// 1 ≤ M ≤ kSmallRows.
template <typename W>
inline void small_gemm_kernel(const uint16_t* x, int64_t M, const W* w, const uint16_t* scale, int64_t in,
                              int64_t out, float* y) {
  switch (M) {
#define RS_ROWS(m) \
  case m:          \
    return vnni_rows<m, W>(x, in, w, scale, out, y);
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
RS_VEC_TARGET inline void to_bf16_rows(const float* x, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512i bits = _mm512_srli_epi32(round_bf16_bits(_mm512_maskz_loadu_ps(m, x + i)), 16);
    _mm256_mask_storeu_epi16(out + i, m, _mm512_cvtepi32_epi16(bits));
  }
}

// y [n] = float(bf16(y [n])) in place.
RS_VEC_TARGET inline void round_to_bf16(float* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(round_bf16_bits(_mm512_maskz_loadu_ps(m, y + i))));
  }
}

// y [n] = float(b [n]) for bf16 b.
RS_VEC_TARGET inline void from_bf16_rows(const uint16_t* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = lanes(n - i);
    const __m512i wide = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b + i));
    _mm512_mask_storeu_ps(y + i, m, _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16)));
  }
}

// act [I] = silu(gate [I]) · up [I] (SiLU · up of the MLP).
RS_VEC_TARGET inline void silu_mul(const float* gate, const float* up, int64_t I, float* act) {
  for (int64_t i = 0; i < I; i += 16) {
    const __mmask16 m = lanes(I - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
    _mm512_mask_storeu_ps(act + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

// p [S] = exp(p [S] − top); returns their sum (softmax's numerator and denominator).
RS_VEC_TARGET inline float exp_shifted(float* p, int64_t S, float top) {
  __m512 total = _mm512_setzero_ps();
  for (int64_t s = 0; s < S; s += 16) {
    const __mmask16 m = lanes(S - s);
    const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + s), _mm512_set1_ps(top))));
    _mm512_mask_storeu_ps(p + s, m, e);
    total = _mm512_add_ps(total, e);
  }
  return _mm512_reduce_add_ps(total);
}

// --- Attention of new tokens over the cache -----------------------------------------------------
//
// softmax(q·Kᵀ / √D) · V for one query over keys / values (rows of D floats, heads at any stride:
// the cache's live prefix). What torch's scaled_dot_product_attention computes, up to float32
// summation order, without its per-call setup.

// One query of one head: q [D] over S keys / values (rows of D floats at strides ks / vs) -> out [D].
// Scores four keys at a time (independent accumulators; each key's sum over D in order, then one
// reduction), the softmax's exponentials vectorised, the weighted sum in one pass over the value
// rows (C chunks of 16 accumulated together). p: scratch for S scores. C = D / 16.
template <int C>
RS_ATTN_TARGET inline void attend_head(const float* q, const float* k, int64_t ks, const float* v, int64_t vs,
                                       int64_t S, float* out, float* p) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(16 * C));
  __m512 qv[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(q + 16 * c);
  int64_t s = 0;
  for (; s + 4 <= S; s += 4) {
    __m512 a[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c)
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) a[j] = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + (s + j) * ks + 16 * c), a[j]);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) p[s + j] = _mm512_reduce_add_ps(a[j]) * scale;
  }
  for (; s < S; ++s) {
    __m512 a = _mm512_setzero_ps();
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) a = _mm512_fmadd_ps(qv[c], _mm512_loadu_ps(k + s * ks + 16 * c), a);
    p[s] = _mm512_reduce_add_ps(a) * scale;
  }
  float top = -INFINITY;
  for (int64_t i = 0; i < S; ++i) top = std::max(top, p[i]);
  const float total = exp_shifted(p, S, top);
  __m512 acc[C];
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  for (int64_t i = 0; i < S; ++i) {
    const __m512 w = _mm512_set1_ps(p[i]);
#pragma GCC unroll 16
    for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(w, _mm512_loadu_ps(v + i * vs + 16 * c), acc[c]);
  }
  const __m512 inv = _mm512_set1_ps(total);
#pragma GCC unroll 16
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(out + 16 * c, _mm512_div_ps(acc[c], inv));
}

// attend_head for a head dim D (a multiple of 16, at most 256).
inline void attend_one(const float* q, const float* k, int64_t ks, const float* v, int64_t vs, int64_t S, int64_t D,
                       float* out, float* p) {
  switch (D / 16) {
#define RS_HEAD(c) \
  case c:          \
    return attend_head<c>(q, k, ks, v, vs, S, out, p);
    RS_HEAD(1) RS_HEAD(2) RS_HEAD(3) RS_HEAD(4) RS_HEAD(5) RS_HEAD(6) RS_HEAD(7) RS_HEAD(8)
    RS_HEAD(9) RS_HEAD(10) RS_HEAD(11) RS_HEAD(12) RS_HEAD(13) RS_HEAD(14) RS_HEAD(15) RS_HEAD(16)
#undef RS_HEAD
    default:
      TORCH_CHECK(false, "the attention kernel takes head dims 16 to 256 in steps of 16, not ", D);
  }
}

// One sequence: q [H, D] over the first S positions of keys / values (batch row `b` of the cache
// buffers [B, Hkv, capacity, D]) -> out [H, D]; head h reads kv head h·Hkv/H; p: scratch.
inline void attend_row(const float* q, const at::Tensor& keys, const at::Tensor& values, int64_t b, int64_t S,
                       int64_t H, float* out, std::vector<float>& p) {
  const int64_t Hkv = keys.size(1), D = keys.size(3);
  p.resize(S);
  const float* kd = keys.data_ptr<float>() + b * keys.stride(0);
  const float* vd = values.data_ptr<float>() + b * values.stride(0);
  for (int64_t h = 0; h < H; ++h) {
    const int64_t g = h * Hkv / H;
    attend_one(q + h * D, kd + g * keys.stride(1), keys.stride(2), vd + g * values.stride(1), values.stride(2), S, D,
               out + h * D, p.data());
  }
}

// out = x / sqrt(mean(x²) + eps) · w, with w the first half of the doubled weight (rms_norm).
inline void rms_norm1(const float* x, const at::Tensor& weight2, double eps, int64_t H, float* out) {
  const float* w = weight2.data_ptr<float>();
  float squares = 0.0f;
  for (int64_t i = 0; i < H; ++i) squares += x[i] * x[i];
  const float scale = 1.0f / std::sqrt(squares / static_cast<float>(H) + static_cast<float>(eps));
  for (int64_t i = 0; i < H; ++i) out[i] = x[i] * scale * w[i];
}

// Rotary of `heads` vectors of D floats in place (_rotate: x · cos + rotate_half(x) · sin).
inline void rotate1(float* x, int64_t heads, int64_t D, const float* cos, const float* sin) {
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

}  // namespace rs_kernels
