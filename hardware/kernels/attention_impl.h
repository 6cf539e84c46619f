/* What attention.c (portable C), attention_avx2.c and attention_avx512.c share: the exp polynomial's constants and the task's loops
 * around the per-(token, head) arithmetic, whose order every kernel keeps (attention.c says how). */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "exp_cephes.h" /* its constants: attention_avx512.c's 16-lane exp */

#if defined(__x86_64__)
#include <immintrin.h>
/* the tree of sum_tree / max_tree over 16 lanes held as two 8-lane halves (lanes l and l + 8, then the 4-, 2- and
   1-apart pairs): the AVX2 kernel's, and the AVX-512 one's after splitting its vector */
__attribute__((target("avx2"))) static inline float tree_256(__m256 lo, __m256 hi, int is_max) {
  const __m256 a8 = is_max ? _mm256_max_ps(lo, hi) : _mm256_add_ps(lo, hi);
  const __m128 l4 = _mm256_castps256_ps128(a8), h4 = _mm256_extractf128_ps(a8, 1);
  const __m128 a4 = is_max ? _mm_max_ps(l4, h4) : _mm_add_ps(l4, h4);
  const __m128 h2 = _mm_movehl_ps(a4, a4);
  const __m128 a2 = is_max ? _mm_max_ps(a4, h2) : _mm_add_ps(a4, h2);
  const __m128 h1 = _mm_shuffle_ps(a2, a2, 1);
  return _mm_cvtss_f32(is_max ? _mm_max_ss(a2, h1) : _mm_add_ss(a2, h1));
}
#endif

#define LANES 16 /* a dot product's and a sum's lanes in every kernel */

/* -- the task: the same loops for every kernel ------------------------------------------------------------------
   Task i: row i / (kv_heads / kv_per_task), KV heads [g0, g0 + kv_per_task). Token s's scores lie after the earlier
   tokens', as [its query heads of the task][its seen[s] slots]. The kernels' passes go over the cache's slots
   0..cached[s] - 1 of each token; a tree token's others (the call's tokens it sees) come after, in TREE_DOTS and
   TREE_VALUES. */
/* the task's row b, its first KV head g0 (of per), query heads per token hs, the K/V rows from g0, its tokens' positions,
   slots seen and slots cached, its scores and the most cached slots a token reads, N */
#define TASK_SETUP                                                                                                   \
  const int S = p->S, hd = p->head_dim, G = p->heads / p->kv_heads, per = p->kv_per_task, hs = per * G;            \
  const size_t parts = (size_t)(p->kv_heads / per), b = i / parts, g0 = i % parts * per, row = (size_t)p->kv_heads * hd; \
  const float *K = p->k + b * p->capacity * row + g0 * hd, *V = p->v + b * p->capacity * row + g0 * hd;           \
  const int64_t* pos = p->pos + b * S;                                                                             \
  const int32_t *seen = p->seen + b * S, *cached = p->cached + b * S;                                              \
  float* const scores = p->scratch + p->scratch_at[i];                                                            \
  int N = 0;                                                                                                       \
  for (int s = 0; s < S; s++) N = cached[s] > N ? cached[s] : N;

/* for each tree token s whose slots go past its cached ones, and each call token t it sees, in call order: the statements
   given, with n (its slots seen), sc (its scores), j (the slot's index among its n) and r (the offset of t's K and V rows
   from K and V: t's slot is pos[0] + t) */
#define FOR_TREE_SLOTS(...)                                                                                          \
  if (p->tree) {                                                                                                   \
    float* sc = scores;                                                                                            \
    for (int s = 0; s < S; s++) {                                                                                  \
      const int n = seen[s];                                                                                       \
      if (cached[s] < n) {                                                                                         \
        const uint8_t* sees = p->tree + (b * S + s) * S;                                                           \
        for (int t = 0, j = cached[s]; t < S; t++)                                                                 \
          if (sees[t]) {                                                                                           \
            const size_t r = ((size_t)pos[0] + t) * row;                                                           \
            __VA_ARGS__                                                                                            \
            j++;                                                                                                   \
          }                                                                                                        \
      }                                                                                                            \
      sc += (size_t)hs * n;                                                                                        \
    }                                                                                                              \
  }

/* pass 1 of those slots: dot(q, k) * scale by DOT1(q, k, hd), a kernel's dot product of one query and one K row (the same
   bits as its passes' dot products) */
#define TREE_DOTS(DOT1)                                                                                              \
  FOR_TREE_SLOTS(const float* q = p->q + ((b * S + s) * p->heads + g0 * G) * hd;                                   \
                 for (int x = 0; x < hs; x++) sc[(size_t)x * n + j] = DOT1(q + (size_t)x * hd, K + r + (size_t)(x / G) * hd, hd) * p->scale;)

/* pass 3 of those slots, after the cached ones: out += e * v by AXPY(e, v, out, hd), lane-wise fmas as every kernel's
   value pass */
#define TREE_VALUES(AXPY)                                                                                            \
  FOR_TREE_SLOTS(float* o = p->out + ((b * S + s) * p->heads + g0 * G) * hd;                                        \
                 for (int x = 0; x < hs; x++) AXPY(sc[(size_t)x * n + j], V + r + (size_t)(x / G) * hd, o + (size_t)x * hd, hd);)

/* pass 2: each (token, head)'s softmax in place, and the outputs zeroed for pass 3 */
#define SOFTMAX_PASS(SOFTMAX)                                                                                        \
  {                                                                                                                \
    float* sc = scores;                                                                                            \
    for (int s = 0; s < S; s++) {                                                                                  \
      const int n = seen[s];                                                                                       \
      for (int x = 0; x < hs; x++) SOFTMAX(sc + (size_t)x * n, n);                                                 \
      memset(p->out + ((b * S + s) * p->heads + g0 * G) * hd, 0, sizeof(float) * hs * hd);                         \
      sc += (size_t)hs * n;                                                                                        \
    }                                                                                                              \
  }

#define DEFINE_TASK(NAME, ATTR, DOT, SOFTMAX, AXPY)                                                                  \
  ATTR static void NAME(const attn_problem* p, size_t i) {                                                         \
    TASK_SETUP                                                                                                     \
    for (int j = 0; j < N; j++) {                                                                                  \
      float* sc = scores;                                                                                          \
      for (int s = 0; s < S; s++) {                                                                                \
        const int n = seen[s];                                                                                     \
        if (j < cached[s]) {                                                                                       \
          const float* q = p->q + ((b * S + s) * p->heads + g0 * G) * hd;                                           \
          for (int g = 0; g < per; g++)                                                                            \
            for (int h = 0; h < G; h++)                                                                            \
              sc[(size_t)(g * G + h) * n + j] = DOT(q + (size_t)(g * G + h) * hd, K + j * row + (size_t)g * hd, hd) * p->scale; \
        }                                                                                                          \
        sc += (size_t)hs * n;                                                                                      \
      }                                                                                                            \
    }                                                                                                              \
    TREE_DOTS(DOT)                                                                                                 \
    SOFTMAX_PASS(SOFTMAX)                                                                                          \
    for (int j = 0; j < N; j++) {                                                                                  \
      float* sc = scores;                                                                                          \
      for (int s = 0; s < S; s++) {                                                                                \
        const int n = seen[s];                                                                                     \
        if (j < cached[s]) {                                                                                       \
          float* o = p->out + ((b * S + s) * p->heads + g0 * G) * hd;                                               \
          for (int g = 0; g < per; g++)                                                                            \
            for (int h = 0; h < G; h++)                                                                            \
              AXPY(sc[(size_t)(g * G + h) * n + j], V + j * row + (size_t)g * hd, o + (size_t)(g * G + h) * hd, hd); \
        }                                                                                                          \
        sc += (size_t)hs * n;                                                                                      \
      }                                                                                                            \
    }                                                                                                              \
    TREE_VALUES(AXPY)                                                                                              \
  }


#if defined(__x86_64__)
void task_avx512(const attn_problem* p, size_t i); /* attention_avx512.c */
void task_avx2(const attn_problem* p, size_t i);   /* attention_avx2.c */
#endif
