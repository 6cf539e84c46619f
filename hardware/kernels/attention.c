/* CachedAttention's arithmetic (attention.h): per task, three passes over the token's visible slots 0..n-1.
 *
 *   1. scores[h][j] = dot(q_h, k_j) * scale           each K row read once for the group's query heads
 *   2. e[h][j] = exp(scores[h][j] - max_j), sum_h     the max subtracted first: no overflow, whatever the scores
 *   3. out_h = (sum_j e[h][j] * v_j) / sum_h          each V row read once for the group's query heads
 *
 * Bit identity across ISAs: a dot product and a sum over slots are 16 lanes (lane l takes elements l, l + 16, ...;
 * a tail's missing elements are zeros), reduced in one tree order (l + 8, then + 4, + 2, + 1); the AVX-512 kernel is
 * one 16-lane vector, the AVX2 kernel two 8-lane halves, the portable one an array of 16 floats, each doing the same
 * IEEE operations in the same order (compiled with -ffp-contract=off: the only fused multiply-adds are the explicit
 * ones, fmaf in C). The value pass is lane-wise in the head dimension, so its vector width does not matter.
 *
 * exp is Cephes' expf polynomial (swiglu.c's), written out in each kernel: no vector exp of a libm is portable to
 * every compiler and CPU here, and libm's scalar expf rounds differently from any vector code. Its input is s - max
 * <= 0, clamped to >= -87 (where 2^n stays normal; a weight below e^-87 of the largest changes no float32 sum). */
#include "attention.h"

#include <math.h>
#include <string.h>

#include "q4_kernels.h" /* q_kernel(): the ISA this process runs (once per process, $SPECDEC_Q4_KERNEL can pick a slower one) */
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define EXP_LO (-87.0f)
#define LOG2E 1.44269504088896341f
#define LN2_HI 0.693359375f
#define LN2_LO (-2.12194440e-4f)
#define P0 1.9875691500e-4f
#define P1 1.3981999507e-3f
#define P2 8.3334519073e-3f
#define P3 4.1665795894e-2f
#define P4 1.6666665459e-1f
#define P5 5.0000001201e-1f
#define LANES 16

/* the task's pointers: its token's query heads, the token's visible slot count n, its K/V head's column offset */
typedef struct {
  const float* q;   /* [group][head_dim] */
  const float* k;   /* slot j's row at k + j * row */
  const float* v;
  float* out;       /* [group][head_dim] */
  float* scores;    /* [group][n] */
  size_t row;       /* floats between two slots: kv_heads * head_dim */
  int n, group, hd;
} task_view;

static task_view view(const attn_problem* p, size_t i) {
  const size_t kvh = (size_t)p->kv_heads, token = i / kvh, g = i % kvh, b = token / (size_t)p->S;
  const int group = p->heads / p->kv_heads, hd = p->head_dim;
  const size_t q_at = (token * p->heads + g * group) * hd, kv_at = (size_t)b * p->capacity * kvh * hd + g * hd;
  return (task_view){p->q + q_at, p->k + kv_at, p->v + kv_at, p->out + q_at, p->scratch + p->scratch_at[i], kvh * hd,
                     (int)p->pos[token] + 1, group, hd};
}

/* -- portable C: the reference every kernel matches ------------------------------------------------------------- */
float specdec_attention_exp(float x) {
  x = EXP_LO > x ? EXP_LO : x; /* max(lo, x) as x86's maxps(lo, x): NaN stays NaN */
  const float n = nearbyintf(x * LOG2E);
  x = x - n * LN2_HI;
  x = x - n * LN2_LO;
  const float z = x * x;
  float e = P0;
  e = e * x + P1;
  e = e * x + P2;
  e = e * x + P3;
  e = e * x + P4;
  e = e * x + P5;
  e = e * z + x;
  e = e + 1.f;
  union { int32_t i; float f; } pow2 = {.i = ((n == n ? (int32_t)n : 0) + 127) << 23}; /* NaN: e is NaN already */
  return e * pow2.f;
}

static float sum_tree(float* a) { /* a[16]: l + 8, + 4, + 2, + 1 */
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; l++) a[l] = a[l] + a[l + w];
  return a[0];
}

static float max_tree(float* a) { /* the same pairs, max(x, y) as maxps(x, y) = x > y ? x : y */
  for (int w = 8; w >= 1; w /= 2)
    for (int l = 0; l < w; l++) a[l] = a[l] > a[l + w] ? a[l] : a[l + w];
  return a[0];
}

static void task_portable(const task_view* t, float scale) {
  for (int j = 0; j < t->n; j++)
    for (int h = 0; h < t->group; h++) {
      const float *q = t->q + (size_t)h * t->hd, *k = t->k + j * t->row;
      float acc[LANES] = {0};
      for (int d0 = 0; d0 < t->hd; d0 += LANES)
        for (int l = 0; l < LANES; l++) {
          const int d = d0 + l;
          acc[l] = fmaf(d < t->hd ? q[d] : 0.f, d < t->hd ? k[d] : 0.f, acc[l]);
        }
      t->scores[(size_t)h * t->n + j] = sum_tree(acc) * scale;
    }
  float sums[64];
  for (int h = 0; h < t->group; h++) {
    float* s = t->scores + (size_t)h * t->n;
    float mx[LANES], acc[LANES] = {0};
    for (int l = 0; l < LANES; l++) mx[l] = -INFINITY;
    for (int j0 = 0; j0 < t->n; j0 += LANES)
      for (int l = 0; l < LANES; l++) {
        const float x = j0 + l < t->n ? s[j0 + l] : -INFINITY;
        mx[l] = x > mx[l] ? x : mx[l];
      }
    const float m = max_tree(mx);
    for (int j0 = 0; j0 < t->n; j0 += LANES)
      for (int l = 0; l < LANES; l++) {
        const float e = j0 + l < t->n ? specdec_attention_exp(s[j0 + l] - m) : 0.f;
        acc[l] = acc[l] + e;
        if (j0 + l < t->n) s[j0 + l] = e;
      }
    sums[h] = sum_tree(acc);
  }
  memset(t->out, 0, sizeof(float) * t->group * t->hd);
  for (int j = 0; j < t->n; j++)
    for (int h = 0; h < t->group; h++) {
      const float w = t->scores[(size_t)h * t->n + j], *v = t->v + j * t->row;
      float* o = t->out + (size_t)h * t->hd;
      for (int d = 0; d < t->hd; d++) o[d] = fmaf(w, v[d], o[d]);
    }
  for (int h = 0; h < t->group; h++)
    for (int d = 0; d < t->hd; d++) t->out[(size_t)h * t->hd + d] = t->out[(size_t)h * t->hd + d] / sums[h];
}

#if defined(__x86_64__)
/* -- AVX-512: one 16-lane vector ------------------------------------------------------------------------------ */
#define AVX512 __attribute__((target("avx512f")))

AVX512 static inline __m512 exp_512(__m512 x) {
  x = _mm512_max_ps(_mm512_set1_ps(EXP_LO), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_HI)));
  x = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(LN2_LO)));
  const __m512 z = _mm512_mul_ps(x, x);
  __m512 e = _mm512_set1_ps(P0);
  e = _mm512_add_ps(_mm512_mul_ps(e, x), _mm512_set1_ps(P1));
  e = _mm512_add_ps(_mm512_mul_ps(e, x), _mm512_set1_ps(P2));
  e = _mm512_add_ps(_mm512_mul_ps(e, x), _mm512_set1_ps(P3));
  e = _mm512_add_ps(_mm512_mul_ps(e, x), _mm512_set1_ps(P4));
  e = _mm512_add_ps(_mm512_mul_ps(e, x), _mm512_set1_ps(P5));
  e = _mm512_add_ps(_mm512_mul_ps(e, z), x);
  e = _mm512_add_ps(e, _mm512_set1_ps(1.f));
  const __m512i pow2 = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(e, _mm512_castsi512_ps(pow2));
}

/* the tree of sum_tree / max_tree: lanes l and l + 8, then the 4-, 2- and 1-apart pairs */
AVX512 static inline float tree_512(__m512 a, int is_max) {
  const __m256 lo = _mm512_castps512_ps256(a), hi = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
  const __m256 a8 = is_max ? _mm256_max_ps(lo, hi) : _mm256_add_ps(lo, hi);
  const __m128 l4 = _mm256_castps256_ps128(a8), h4 = _mm256_extractf128_ps(a8, 1);
  const __m128 a4 = is_max ? _mm_max_ps(l4, h4) : _mm_add_ps(l4, h4);
  const __m128 h2 = _mm_movehl_ps(a4, a4);
  const __m128 a2 = is_max ? _mm_max_ps(a4, h2) : _mm_add_ps(a4, h2);
  const __m128 h1 = _mm_shuffle_ps(a2, a2, 1);
  return _mm_cvtss_f32(is_max ? _mm_max_ss(a2, h1) : _mm_add_ss(a2, h1));
}

AVX512 static void task_avx512(const task_view* t, float scale) {
  const int hd = t->hd, tail = hd % LANES;
  const __mmask16 tail_mask = (__mmask16)((1u << tail) - 1);
  for (int j = 0; j < t->n; j++) {
    const float* k = t->k + j * t->row;
    for (int h = 0; h < t->group; h++) {
      const float* q = t->q + (size_t)h * hd;
      __m512 acc = _mm512_setzero_ps();
      int d = 0;
      for (; d + LANES <= hd; d += LANES) acc = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), acc);
      if (tail) acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail_mask, q + d), _mm512_maskz_loadu_ps(tail_mask, k + d), acc);
      t->scores[(size_t)h * t->n + j] = tree_512(acc, 0) * scale;
    }
  }
  float sums[64];
  for (int h = 0; h < t->group; h++) {
    float* s = t->scores + (size_t)h * t->n;
    __m512 mx = _mm512_set1_ps(-INFINITY), acc = _mm512_setzero_ps();
    for (int j = 0; j < t->n; j += LANES) {
      const __mmask16 valid = t->n - j >= LANES ? 0xFFFF : (__mmask16)((1u << (t->n - j)) - 1);
      mx = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), valid, s + j), mx);
    }
    const __m512 m = _mm512_set1_ps(tree_512(mx, 1));
    for (int j = 0; j < t->n; j += LANES) {
      const __mmask16 valid = t->n - j >= LANES ? 0xFFFF : (__mmask16)((1u << (t->n - j)) - 1);
      const __m512 e = _mm512_maskz_mov_ps(valid, exp_512(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, s + j), m)));
      acc = _mm512_add_ps(acc, e);
      _mm512_mask_storeu_ps(s + j, valid, e);
    }
    sums[h] = tree_512(acc, 0);
  }
  memset(t->out, 0, sizeof(float) * t->group * hd);
  for (int j = 0; j < t->n; j++) {
    const float* v = t->v + j * t->row;
    for (int h = 0; h < t->group; h++) {
      const __m512 w = _mm512_set1_ps(t->scores[(size_t)h * t->n + j]);
      float* o = t->out + (size_t)h * hd;
      int d = 0;
      for (; d + LANES <= hd; d += LANES) _mm512_storeu_ps(o + d, _mm512_fmadd_ps(w, _mm512_loadu_ps(v + d), _mm512_loadu_ps(o + d)));
      if (tail)
        _mm512_mask_storeu_ps(o + d, tail_mask, _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(tail_mask, v + d), _mm512_maskz_loadu_ps(tail_mask, o + d)));
    }
  }
  for (int h = 0; h < t->group; h++) {
    const __m512 sum = _mm512_set1_ps(sums[h]);
    float* o = t->out + (size_t)h * hd;
    int d = 0;
    for (; d + LANES <= hd; d += LANES) _mm512_storeu_ps(o + d, _mm512_div_ps(_mm512_loadu_ps(o + d), sum));
    if (tail) _mm512_mask_storeu_ps(o + d, tail_mask, _mm512_div_ps(_mm512_maskz_loadu_ps(tail_mask, o + d), sum));
  }
}

/* -- AVX2: the 16 lanes as two 8-lane halves --------------------------------------------------------------------- */
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline __m256 exp_256(__m256 x) {
  x = _mm256_max_ps(_mm256_set1_ps(EXP_LO), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  x = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_HI)));
  x = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(LN2_LO)));
  const __m256 z = _mm256_mul_ps(x, x);
  __m256 e = _mm256_set1_ps(P0);
  e = _mm256_add_ps(_mm256_mul_ps(e, x), _mm256_set1_ps(P1));
  e = _mm256_add_ps(_mm256_mul_ps(e, x), _mm256_set1_ps(P2));
  e = _mm256_add_ps(_mm256_mul_ps(e, x), _mm256_set1_ps(P3));
  e = _mm256_add_ps(_mm256_mul_ps(e, x), _mm256_set1_ps(P4));
  e = _mm256_add_ps(_mm256_mul_ps(e, x), _mm256_set1_ps(P5));
  e = _mm256_add_ps(_mm256_mul_ps(e, z), x);
  e = _mm256_add_ps(e, _mm256_set1_ps(1.f));
  const __m256i pow2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(e, _mm256_castsi256_ps(pow2));
}

AVX2 static inline float tree_256(__m256 lo, __m256 hi, int is_max) {
  const __m256 a8 = is_max ? _mm256_max_ps(lo, hi) : _mm256_add_ps(lo, hi);
  const __m128 l4 = _mm256_castps256_ps128(a8), h4 = _mm256_extractf128_ps(a8, 1);
  const __m128 a4 = is_max ? _mm_max_ps(l4, h4) : _mm_add_ps(l4, h4);
  const __m128 h2 = _mm_movehl_ps(a4, a4);
  const __m128 a2 = is_max ? _mm_max_ps(a4, h2) : _mm_add_ps(a4, h2);
  const __m128 h1 = _mm_shuffle_ps(a2, a2, 1);
  return _mm_cvtss_f32(is_max ? _mm_max_ss(a2, h1) : _mm_add_ss(a2, h1));
}

/* lanes [first, first + 8) that are below `count`, as a maskload mask */
AVX2 static inline __m256i below(int count, int first) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

AVX2 static void task_avx2(const task_view* t, float scale) {
  const int hd = t->hd;
  for (int j = 0; j < t->n; j++) {
    const float* k = t->k + j * t->row;
    for (int h = 0; h < t->group; h++) {
      const float* q = t->q + (size_t)h * hd;
      __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
      for (int d = 0; d < hd; d += LANES) {
        if (d + LANES <= hd) {
          lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), lo);
          hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), hi);
        } else { /* the tail: missing elements are zeros, as in the other kernels */
          const __m256i m0 = below(hd, d), m1 = below(hd, d + 8);
          lo = _mm256_fmadd_ps(_mm256_maskload_ps(q + d, m0), _mm256_maskload_ps(k + d, m0), lo);
          hi = _mm256_fmadd_ps(_mm256_maskload_ps(q + d + 8, m1), _mm256_maskload_ps(k + d + 8, m1), hi);
        }
      }
      t->scores[(size_t)h * t->n + j] = tree_256(lo, hi, 0) * scale;
    }
  }
  float sums[64];
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  for (int h = 0; h < t->group; h++) {
    float* s = t->scores + (size_t)h * t->n;
    __m256 mlo = ninf, mhi = ninf, alo = _mm256_setzero_ps(), ahi = _mm256_setzero_ps();
    for (int j = 0; j < t->n; j += LANES) {
      const __m256i v0 = below(t->n, j), v1 = below(t->n, j + 8);
      mlo = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j, v0), _mm256_castsi256_ps(v0)), mlo);
      mhi = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j + 8, v1), _mm256_castsi256_ps(v1)), mhi);
    }
    const __m256 m = _mm256_set1_ps(tree_256(mlo, mhi, 1));
    for (int j = 0; j < t->n; j += LANES) {
      const __m256i v0 = below(t->n, j), v1 = below(t->n, j + 8);
      const __m256 e0 = _mm256_and_ps(exp_256(_mm256_sub_ps(_mm256_maskload_ps(s + j, v0), m)), _mm256_castsi256_ps(v0));
      const __m256 e1 = _mm256_and_ps(exp_256(_mm256_sub_ps(_mm256_maskload_ps(s + j + 8, v1), m)), _mm256_castsi256_ps(v1));
      alo = _mm256_add_ps(alo, e0);
      ahi = _mm256_add_ps(ahi, e1);
      _mm256_maskstore_ps(s + j, v0, e0);
      _mm256_maskstore_ps(s + j + 8, v1, e1);
    }
    sums[h] = tree_256(alo, ahi, 0);
  }
  memset(t->out, 0, sizeof(float) * t->group * hd);
  for (int j = 0; j < t->n; j++) {
    const float* v = t->v + j * t->row;
    for (int h = 0; h < t->group; h++) {
      const __m256 w = _mm256_set1_ps(t->scores[(size_t)h * t->n + j]);
      float* o = t->out + (size_t)h * hd;
      int d = 0;
      for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(o + d, _mm256_fmadd_ps(w, _mm256_loadu_ps(v + d), _mm256_loadu_ps(o + d)));
      for (; d < hd; d++) o[d] = fmaf(t->scores[(size_t)h * t->n + j], v[d], o[d]);
    }
  }
  for (int h = 0; h < t->group; h++) {
    const __m256 sum = _mm256_set1_ps(sums[h]);
    float* o = t->out + (size_t)h * hd;
    int d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), sum));
    for (; d < hd; d++) o[d] = o[d] / sums[h];
  }
}
#endif

void attention_task(const attn_problem* p, size_t i) {
  const task_view t = view(p, i);
#if defined(__x86_64__)
  const int kernel = q_kernel();
  if (kernel == KERNEL_VNNI) { /* AVX-512 VNNI implies AVX-512F */
    task_avx512(&t, p->scale);
    return;
  }
  if (kernel == KERNEL_AVX2) {
    task_avx2(&t, p->scale);
    return;
  }
#endif
  task_portable(&t, p->scale);
}
