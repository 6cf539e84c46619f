/* CachedAttention's arithmetic (attention.h). A task is one row's tokens over a block of its KV heads, in three passes:
 *
 *   1. scores[s][h][j] = dot(q_sh, k_j) * scale        slots j outermost: each K row is read once for all the task's
 *                                                       tokens and query heads (a token sees slots 0..its position)
 *   2. e[s][h][j] = exp(scores - max) / sum            the max subtracted first: no overflow, whatever the scores
 *   3. out_sh = sum_j e[s][h][j] * v_j                  each V row read once, as K
 *
 * Bit identity across rows and ISAs: every (token, head) takes the same operations in the same order whatever the
 * task holds (the loops around it only interleave independent heads and tokens). A dot product and a sum over slots
 * are 16 lanes (lane l takes elements l, l + 16, ...; a tail's missing elements are zeros), reduced in one tree order
 * (l + 8, then + 4, + 2, + 1); the AVX-512 kernel is one 16-lane vector, the AVX2 kernel two 8-lane halves, the
 * portable one an array of 16 floats, each doing the same IEEE operations in the same order (compiled with
 * -ffp-contract=off: the only fused multiply-adds are the explicit ones, fmaf in C). The value pass is lane-wise in
 * the head dimension, so its vector width does not matter. The kernels differ only in how they go through the slots:
 * the AVX-512 one (attention_avx512.c) takes two query rows' dot products with 8 slots at a time (a one-token call: one
 * query's with 16) and shares V rows between query rows; the AVX2 one (attention_avx2.c) takes a query's with 8 slots
 * at a time and shares V rows between two query rows.
 *
 * exp is Cephes' expf polynomial (swiglu.c's), written out in each kernel: no vector exp of a libm is portable to
 * every compiler and CPU here, and libm's scalar expf rounds differently from any vector code. Its input is s - max
 * <= 0, clamped to >= -87 (where 2^n stays normal; a weight below e^-87 of the largest changes no float32 sum). */
#include <math.h>

#include "attention_impl.h"
#include "q4_kernels.h" /* q_kernel(): the ISA this process runs (once per process, $SPECDEC_Q4_KERNEL can pick a slower one) */

/* -- portable C: the reference every kernel matches ------------------------------------------------------------- */
float specdec_attention_exp(float x) {
  x = EXP_LO > x ? EXP_LO : x; /* max(lo, x) as x86's maxps(lo, x): NaN stays NaN */
  return exp_cephes(x);
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

static inline float dot_c(const float* q, const float* k, int hd) {
  float acc[LANES] = {0};
  for (int d0 = 0; d0 < hd; d0 += LANES)
    for (int l = 0; l < LANES; l++) {
      const int d = d0 + l;
      acc[l] = fmaf(d < hd ? q[d] : 0.f, d < hd ? k[d] : 0.f, acc[l]);
    }
  return sum_tree(acc);
}

/* s[0..n) -> exp(s - max) / sum, in place */
static inline void softmax_c(float* s, int n) {
  float mx[LANES], acc[LANES] = {0};
  for (int l = 0; l < LANES; l++) mx[l] = -INFINITY;
  for (int j0 = 0; j0 < n; j0 += LANES)
    for (int l = 0; l < LANES; l++) {
      const float x = j0 + l < n ? s[j0 + l] : -INFINITY;
      mx[l] = x > mx[l] ? x : mx[l];
    }
  const float m = max_tree(mx);
  for (int j0 = 0; j0 < n; j0 += LANES)
    for (int l = 0; l < LANES; l++) {
      const float e = j0 + l < n ? specdec_attention_exp(s[j0 + l] - m) : 0.f;
      acc[l] = acc[l] + e;
      if (j0 + l < n) s[j0 + l] = e;
    }
  const float sum = sum_tree(acc);
  for (int j = 0; j < n; j++) s[j] = s[j] / sum;
}

static inline void axpy_c(float w, const float* v, float* o, int hd) {
  for (int d = 0; d < hd; d++) o[d] = fmaf(w, v[d], o[d]);
}

DEFINE_TASK(task_portable, , dot_c, softmax_c, axpy_c)

void attention_task(const attn_problem* p, size_t i) {
#if defined(__x86_64__)
  const int kernel = q_kernel();
  if (kernel == KERNEL_VNNI) { /* AVX-512 VNNI implies AVX-512F */
    task_avx512(p, i);
    return;
  }
  if (kernel == KERNEL_AVX2) {
    task_avx2(p, i);
    return;
  }
#endif
  task_portable(p, i);
}

/* -- RotaryCachedAttention: rotary and the cache write inside the task ------------------------------------------ */
/* One body, compiled twice: with FMA the compiler turns fmaf into vector FMAs, without it into libm's fmaf; both round
   each fmaf once, so the bits are the same (and ONNX Runtime's AVX2 RotaryEmbedding's: MLAS computes these two FMAs) */
#define ROTATE_BODY                                                                                  \
  const int h = hd / 2;                                                                              \
  for (int d = 0; d < h; d++) {                                                                      \
    const float re = x[d], im = x[d + h];                                                            \
    y[d] = fmaf(re, c[d], -(im * s[d]));                                                             \
    y[d + h] = fmaf(re, s[d], im * c[d]);                                                            \
  }

static void rotate_c(const float* restrict x, const float* restrict c, const float* restrict s, int hd, float* restrict y) { ROTATE_BODY }
#if defined(__x86_64__)
__attribute__((target("avx2,fma"))) static void rotate_fma(const float* restrict x, const float* restrict c, const float* restrict s, int hd,
                                                            float* restrict y) {
  ROTATE_BODY
}
#endif

void attention_rotate(const float* x, const float* c, const float* s, int hd, float* y) {
#if defined(__x86_64__)
  if (q_kernel() != KERNEL_PORTABLE) {
    rotate_fma(x, c, s, hd, y);
    return;
  }
#endif
  rotate_c(x, c, s, hd, y);
}

void rotary_attention_task(const rotary_attn_problem* p, size_t i) {
  const attn_problem* a = &p->attn;
  const int S = a->S, hd = a->head_dim, G = a->heads / a->kv_heads, per = a->kv_per_task, half = hd / 2;
  const size_t parts = (size_t)(a->kv_heads / per), b = i / parts, g0 = i % parts * per;
  const size_t row = (size_t)a->kv_heads * hd;
  const int64_t* pos = a->pos + b * S;
  for (int s = 0; s < S; s++) {
    const size_t t = b * S + s, slot = (size_t)pos[0] + s; /* the caller checked pos[0] + S <= capacity */
    const float *c = p->cos + (size_t)pos[s] * half, *sn = p->sin + (size_t)pos[s] * half;
    const float *k = p->k_in + t * p->kv_row + g0 * hd, *v = p->v_in + t * p->kv_row + g0 * hd, *q = p->q_in + t * p->q_row + g0 * G * hd;
    float *key = p->key + (b * a->capacity + slot) * row + g0 * hd, *value = p->value + (b * a->capacity + slot) * row + g0 * hd;
    for (int g = 0; g < per; g++) attention_rotate(k + (size_t)g * hd, c, sn, hd, key + (size_t)g * hd);
    memcpy(value, v, sizeof(float) * per * hd);
    float* qr = p->q_rot + (t * a->heads + g0 * G) * hd;
    for (int x = 0; x < per * G; x++) attention_rotate(q + (size_t)x * hd, c, sn, hd, qr + (size_t)x * hd);
  }
  attention_task(a, i);
}
