/* CachedAttention's AVX2 kernel (attention.c says what every kernel computes and why their bits agree): the same
 * arithmetic per (token, head) as the portable one, for x86 CPUs without AVX-512 VNNI (AMD Zen 1-3, Intel cores before
 * Ice Lake and client cores from Alder Lake on). A query's dot products go 8 slots at a time with one transposed
 * reduction for the eight (a dot product alone ends in a chain of 7 dependent shuffles and adds), and the value pass
 * keeps two query rows' outputs in registers over a block of slots, each V row loaded once for both (a row alone would
 * load and store its output for every slot). A (k + 1)-token verification spends most of its attention time in these
 * two loops. */
#include <math.h>

#include "attention_impl.h"
#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline __m256 exp_256(__m256 x) { return exp_cephes_256(_mm256_max_ps(_mm256_set1_ps(EXP_LO), x)); }

/* lanes [first, first + 8) that are below `count`, as a maskload mask */
AVX2 static inline __m256i below(int count, int first) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(count), _mm256_add_epi32(_mm256_set1_epi32(first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

/* [a0, a2, a4, a6 | a1, a3, a5, a7]'s sum_trees, for 8 dot products whose first tree level is taken (a[i] = lanes
   l + (l + 8), l < 8): the tree's other pairs (l + 4, + 2, + 1) for the eight at once, by shuffles that keep each
   pair (dots8_256 puts its dots in that order, so that dot i comes out in lane i without a permute) */
AVX2 static inline __m256 trees8_256(const __m256* a) {
  __m256 c[4], d[2];
  for (int x = 0; x < 4; x++) /* [a_2x's l + (l + 4), a_2x+1's], l < 4 */
    c[x] = _mm256_add_ps(_mm256_permute2f128_ps(a[2 * x], a[2 * x + 1], 0x20), _mm256_permute2f128_ps(a[2 * x], a[2 * x + 1], 0x31));
  for (int y = 0; y < 2; y++) /* l + (l + 2), l < 2: [a_4y's, a_4y+2's | a_4y+1's, a_4y+3's] */
    d[y] = _mm256_add_ps(_mm256_shuffle_ps(c[2 * y], c[2 * y + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm256_shuffle_ps(c[2 * y], c[2 * y + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  /* l + (l + 1): [a0, a2, a4, a6 | a1, a3, a5, a7] */
  return _mm256_add_ps(_mm256_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

/* dot(q, k_i) for slots i < 8 of rows `row` floats apart (lane i; slots past count read the last one again and their
   lanes are not stored), each as dot_c computes it alone: 16 lanes as two 8-lane halves, chunks in order, a tail's
   missing elements zeros. A slot's dot product is finished (to its first tree level) before the next one's starts,
   so 8 of them fit AVX2's 16 registers and their reductions overlap */
__attribute__((target("avx2,fma"), always_inline)) static inline __m256 dots8_256(const float* q, const float* k, size_t row, int count,
                                                                                  const int hd) {
  __m256 a[8];
  const int whole = hd / LANES * LANES;
  const __m256i m0 = below(hd, whole), m1 = below(hd, whole + 8);
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    const float* kr = k + (size_t)(i < count ? i : count - 1) * row;
    __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
    for (int d = 0; d < whole; d += LANES) {
      lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kr + d), lo);
      hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(kr + d + 8), hi);
    }
    if (whole < hd) { /* (an upper half past the head adds 0 * 0: the same as the portable kernel's zeros) */
      lo = _mm256_fmadd_ps(_mm256_maskload_ps(q + whole, m0), _mm256_maskload_ps(kr + whole, m0), lo);
      if (whole + 8 < hd) hi = _mm256_fmadd_ps(_mm256_maskload_ps(q + whole + 8, m1), _mm256_maskload_ps(kr + whole + 8, m1), hi);
      else hi = _mm256_fmadd_ps(_mm256_setzero_ps(), _mm256_setzero_ps(), hi);
    }
    a[(i & 3) * 2 + (i >> 2)] = _mm256_add_ps(lo, hi); /* l + (l + 8); at a[0, 2, 4, 6, 1, 3, 5, 7]: trees8_256 leaves dot i in lane i */
  }
  return trees8_256(a);
}

/* pass 1 for head size HD (a constant for the common ones: each compiles whole, inlined): each query row's dot
   products 8 slots at a time, a whole block's without the checks of a block cut short; the K rows prefetched a few
   slots ahead */
#define DOT_PASS_256(HD)                                                                                             \
  for (int j0 = 0; j0 < N; j0 += 8) {                                                                              \
    /* a few slots ahead into cache: a slot's rows lie a whole cache row apart, which no hardware prefetcher follows */ \
    for (int j = j0 + PF_SLOTS; j < j0 + PF_SLOTS + 8 && j < N; j++)                                               \
      for (size_t f = 0; f < span; f += 16) _mm_prefetch((const char*)(K + j * row + f), _MM_HINT_T0);             \
    float* sc = scores;                                                                                            \
    for (int s = 0; s < S; s++) {                                                                                  \
      const int n = seen[s];                                                                                       \
      if (j0 < cached[s]) {                                                                                        \
        const int count = cached[s] - j0 < 8 ? cached[s] - j0 : 8;                                                 \
        const float* q = p->q + ((b * S + s) * p->heads + g0 * G) * (HD);                                          \
        for (int g = 0, x = 0; g < per; g++)                                                                       \
          for (int h = 0; h < G; h++, x++) { /* query head x = g G + h of the task reads KV head g */              \
            const float *qx = q + (size_t)x * (HD), *kx = K + j0 * row + (size_t)g * (HD);                          \
            float* to = sc + (size_t)x * n + j0;                                                                   \
            if (count == 8) /* (a masked store is slow on AMD's cores) */                                          \
              _mm256_storeu_ps(to, _mm256_mul_ps(dots8_256(qx, kx, row, 8, HD), scale));                           \
            else {                                                                                                 \
              float lanes[8];                                                                                      \
              _mm256_storeu_ps(lanes, _mm256_mul_ps(dots8_256(qx, kx, row, count, HD), scale));                    \
              for (int c = 0; c < count; c++) to[c] = lanes[c];                                                    \
            }                                                                                                      \
          }                                                                                                        \
      }                                                                                                            \
      sc += (size_t)hs * n;                                                                                        \
    }                                                                                                              \
  }

/* s[0..n) -> exp(s - max) / sum, in place. Whole vectors are loaded and stored plainly, only the tail under a mask:
   a masked store costs about ten times a plain one on AMD's cores */
AVX2 static inline void softmax_256(float* s, int n) {
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 mlo = ninf, mhi = ninf, alo = _mm256_setzero_ps(), ahi = _mm256_setzero_ps();
  const int whole = n / LANES * LANES; /* slots in whole 16-lane chunks */
  int j = 0;
  for (; j < whole; j += LANES) {
    mlo = _mm256_max_ps(_mm256_loadu_ps(s + j), mlo);
    mhi = _mm256_max_ps(_mm256_loadu_ps(s + j + 8), mhi);
  }
  const int upper = whole + 8 < n; /* the tail reaches its upper half (else that half adds nothing: max with -inf, + 0) */
  if (j < n) {
    const __m256i v0 = below(n, j), v1 = below(n, j + 8);
    mlo = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j, v0), _mm256_castsi256_ps(v0)), mlo);
    if (upper) mhi = _mm256_max_ps(_mm256_blendv_ps(ninf, _mm256_maskload_ps(s + j + 8, v1), _mm256_castsi256_ps(v1)), mhi);
  }
  const __m256 m = _mm256_set1_ps(tree_256(mlo, mhi, 1));
  for (j = 0; j < whole; j += LANES) {
    const __m256 e0 = exp_256(_mm256_sub_ps(_mm256_loadu_ps(s + j), m)), e1 = exp_256(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), m));
    alo = _mm256_add_ps(alo, e0);
    ahi = _mm256_add_ps(ahi, e1);
    _mm256_storeu_ps(s + j, e0);
    _mm256_storeu_ps(s + j + 8, e1);
  }
  if (j < n) { /* the missing lanes add zeros, as in the other kernels (the sums are never -0) */
    const __m256i v0 = below(n, j), v1 = below(n, j + 8);
    const __m256 e0 = _mm256_and_ps(exp_256(_mm256_sub_ps(_mm256_maskload_ps(s + j, v0), m)), _mm256_castsi256_ps(v0));
    alo = _mm256_add_ps(alo, e0);
    _mm256_maskstore_ps(s + j, v0, e0);
    if (upper) {
      const __m256 e1 = _mm256_and_ps(exp_256(_mm256_sub_ps(_mm256_maskload_ps(s + j + 8, v1), m)), _mm256_castsi256_ps(v1));
      ahi = _mm256_add_ps(ahi, e1);
      _mm256_maskstore_ps(s + j + 8, v1, e1);
    }
  }
  const float total = tree_256(alo, ahi, 0);
  const __m256 sum = _mm256_set1_ps(total);
  for (j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_div_ps(_mm256_loadu_ps(s + j), sum));
  for (; j < n; j++) s[j] = s[j] / total;
}

/* o_r += e_r[j] * v_j for slots j0 <= j < j1 and R (1 or 2) query rows, over the 32-float chunk of the head at d (NV
   vectors, each masked by m where the head ends inside the chunk): the outputs held in registers over the slots,
   each V vector loaded once for the R rows. Per lane and row: axpy_c's fmas in slot order */
#define VALUES_256(R, NV, LOAD)                                                                                      \
  {                                                                                                                \
    __m256 acc[R][NV];                                                                                             \
    for (int r = 0; r < R; r++)                                                                                    \
      for (int x = 0; x < NV; x++) acc[r][x] = full ? _mm256_loadu_ps(o[r] + d + 8 * x) : _mm256_maskload_ps(o[r] + d + 8 * x, m[x]); \
    for (int j = j0; j < j1; j++) {                                                                                \
      const float* vr = v + j * row + d;                                                                           \
      __m256 w[R];                                                                                                 \
      for (int r = 0; r < R; r++) w[r] = _mm256_broadcast_ss(e[r] + j);                                            \
      for (int x = 0; x < NV; x++) {                                                                               \
        __m256 vv = LOAD;                                                                                          \
        if (R > 1) __asm__("" : "+x"(vv)); /* in a register: GCC would load it again as each row's fma operand */     \
        for (int r = 0; r < R; r++) acc[r][x] = _mm256_fmadd_ps(w[r], vv, acc[r][x]);                              \
      }                                                                                                            \
    }                                                                                                              \
    for (int r = 0; r < R; r++)                                                                                    \
      for (int x = 0; x < NV; x++)                                                                                 \
        if (full) _mm256_storeu_ps(o[r] + d + 8 * x, acc[r][x]);                                                   \
        else _mm256_maskstore_ps(o[r] + d + 8 * x, m[x], acc[r][x]);                                              \
  }
#define VALUES_FULL(R, NV) VALUES_256(R, NV, _mm256_loadu_ps(vr + 8 * x))
#define VALUES_MASKED(R, NV) VALUES_256(R, NV, _mm256_maskload_ps(vr + 8 * x, m[x]))
/* the chunk's NV (nv: 1..4) as a constant, so each loop compiles to its own registers; LOAD: FULL or MASKED */
#define VALUES_BY_WIDTH(R, LOAD)                                                                                     \
  {                                                                                                                \
    if (nv == 4) VALUES_##LOAD(R, 4)                                                                               \
    else if (nv == 3) VALUES_##LOAD(R, 3)                                                                          \
    else if (nv == 2) VALUES_##LOAD(R, 2)                                                                          \
    else VALUES_##LOAD(R, 1)                                                                                       \
  }

AVX2 static inline void values_256(int R, const float* const* e, float* const* o, const float* v, size_t row, int j0, int j1, int hd) {
  for (int d = 0; d < hd; d += 32) {
    const int nv = hd - d >= 32 ? 4 : (hd - d + 7) / 8, full = (hd - d) % 8 == 0 || hd - d >= 32;
    __m256i m[4];
    for (int x = 0; x < 4; x++) m[x] = below(hd - d, 8 * x);
    if (R == 2 && full) VALUES_BY_WIDTH(2, FULL)
    else if (R == 2) VALUES_BY_WIDTH(2, MASKED)
    else if (full) VALUES_BY_WIDTH(1, FULL)
    else VALUES_BY_WIDTH(1, MASKED)
  }
}

/* two rows of a values pass over [j0, ends[r]): together over the slots both see, then the longer one alone */
AVX2 static inline void values_pair_256(const float* const* e, float* const* o, const int* ends, const float* v, size_t row, int j0, int hd) {
  const int common = ends[0] < ends[1] ? ends[0] : ends[1];
  values_256(2, e, o, v, row, j0, common, hd);
  const int r = ends[0] > ends[1] ? 0 : 1;
  if (common < ends[r]) values_256(1, e + r, o + r, v, row, common, ends[r], hd);
}

/* dot(q, k) alone, as dots8_256 computes each of its eight (for a tree token's own slots, TREE_DOTS) */
AVX2 static inline float dot1_256(const float* q, const float* k, int hd) {
  const int whole = hd / LANES * LANES;
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int d = 0; d < whole; d += LANES) {
    lo = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), lo);
    hi = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), hi);
  }
  if (whole < hd) {
    const __m256i m0 = below(hd, whole), m1 = below(hd, whole + 8);
    lo = _mm256_fmadd_ps(_mm256_maskload_ps(q + whole, m0), _mm256_maskload_ps(k + whole, m0), lo);
    if (whole + 8 < hd) hi = _mm256_fmadd_ps(_mm256_maskload_ps(q + whole + 8, m1), _mm256_maskload_ps(k + whole + 8, m1), hi);
    else hi = _mm256_fmadd_ps(_mm256_setzero_ps(), _mm256_setzero_ps(), hi);
  }
  return tree_256(lo, hi, 0); /* sum_tree's pairs: l + (l + 8), then + 4, + 2, + 1 */
}

/* o += w * v over the head (for a tree token's own slots, TREE_VALUES): values_256 for one row and one slot */
AVX2 static inline void axpy1_256(float w, const float* v, float* o, int hd) {
  const float* e[1] = {&w};
  float* out[1] = {o};
  values_256(1, e, out, v, 0, 0, 1, hd);
}

/* AVX2: each query's dot products 8 slots at a time, and the value pass over blocks of SLOT_BLOCK slots (their V rows
   stay in cache while it goes over the task's tokens and heads), its query rows in pairs */
enum { SLOT_BLOCK = 64, PF_SLOTS = 16 /* how far ahead the K pass prefetches */ };
AVX2 void task_avx2(const attn_problem* p, size_t i) {
  TASK_SETUP
  const __m256 scale = _mm256_set1_ps(p->scale);
  const size_t span = (size_t)per * hd; /* floats of a row the task reads */
  if (hd == 32) DOT_PASS_256(32)
  else if (hd == 64) DOT_PASS_256(64)
  else if (hd == 128) DOT_PASS_256(128)
  else DOT_PASS_256(hd)
  TREE_DOTS(dot1_256)
  SOFTMAX_PASS(softmax_256)
  for (int j0 = 0; j0 < N; j0 += SLOT_BLOCK) {
    for (int j = j0 + SLOT_BLOCK; j < j0 + 2 * SLOT_BLOCK && j < N; j++) /* the next block's V rows into L2 */
      for (size_t f = 0; f < span; f += 16) _mm_prefetch((const char*)(V + j * row + f), _MM_HINT_T1);
    for (int g = 0; g < per; g++) { /* its SLOT_BLOCK V rows of KV head g, for the query rows in pairs */
      const float* e[2];
      float* o[2];
      int ends[2], pending = 0;
      float* sc = scores;
      for (int s = 0; s < S; s++) {
        const int n = seen[s], c = cached[s];
        for (int h = 0; h < G && j0 < c; h++) { /* row (s, h): its probabilities, its output, its last slot in the block */
          e[pending] = sc + (size_t)(g * G + h) * n;
          o[pending] = p->out + ((b * S + s) * p->heads + (g0 + g) * G + h) * hd;
          ends[pending++] = c < j0 + SLOT_BLOCK ? c : j0 + SLOT_BLOCK;
          if (pending == 2) {
            values_pair_256(e, o, ends, V + (size_t)g * hd, row, j0, hd);
            pending = 0;
          }
        }
        sc += (size_t)hs * n;
      }
      if (pending) values_256(1, e, o, V + (size_t)g * hd, row, j0, ends[0], hd);
    }
  }
  TREE_VALUES(axpy1_256)
}
#endif
