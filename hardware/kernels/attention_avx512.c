/* CachedAttention's AVX-512 kernel (attention.c says what every kernel computes and why their bits agree): the same
 * arithmetic per (token, head) as the portable one, two query rows' dot products with 8 slots at a time (each K row
 * loaded once for both; a one-token call: one query's with 16), the V rows shared by several query rows, and the cache
 * prefetched ahead of the passes. */
#include <math.h>

#include "attention_impl.h"
#if defined(__x86_64__)
#include <immintrin.h>

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
  return tree_256(_mm512_castps512_ps256(a), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1)), is_max);
}

AVX512 static inline __mmask16 first_512(int count) {
  return count >= LANES ? (__mmask16)0xFFFF : count <= 0 ? (__mmask16)0 : (__mmask16)((1u << count) - 1);
}

/* the tree after its first level: b[x] = [dot 2x's l + (l + 8), dot 2x + 1's] (l < 8) -> lane f = dot f's sum_tree, in
   the lane order[f] names of [lane 4q + t: dot 4t + q] */
AVX512 static inline __m512 trees16_rest_512(const __m512* b, __m512i order) {
  __m512 c[4], d[2];
#pragma GCC unroll 4
  for (int x = 0; x < 4; x++) /* quarter r: dot 4x + r's l + (l + 4), l < 4 */
    c[x] = _mm512_add_ps(_mm512_shuffle_f32x4(b[2 * x], b[2 * x + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(b[2 * x], b[2 * x + 1], _MM_SHUFFLE(3, 1, 3, 1)));
#pragma GCC unroll 2
  for (int x = 0; x < 2; x++) /* quarter r: [l + (l + 2) of dot 8x + r, of dot 8x + 4 + r], l < 2 */
    d[x] = _mm512_add_ps(_mm512_shuffle_ps(c[2 * x], c[2 * x + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(c[2 * x], c[2 * x + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  const __m512 r = _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(2, 0, 2, 0)), /* lane 4q + t: dot 4t + q */
                                 _mm512_shuffle_ps(d[0], d[1], _MM_SHUFFLE(3, 1, 3, 1)));
  return _mm512_permutexvar_ps(order, r);
}

/* lane i = sum_tree(a[i]) for 16 dot products' 16-lane sums: sum_tree's pairs (l + 8, + 4, + 2, + 1), taken for the 16
   at once by shuffles that keep each pair, so no horizontal sum is paid per slot */
AVX512 static inline __m512 trees16_512(const __m512* a) {
  __m512 b[8];
#pragma GCC unroll 8
  for (int x = 0; x < 8; x++) /* [a_2x's l + (l + 8), a_2x+1's], l < 8 */
    b[x] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * x], a[2 * x + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a[2 * x], a[2 * x + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  return trees16_rest_512(b, _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
}

/* dot(q, k_i) for slots i < count of 16 rows `row` floats apart (lane i; the others undefined), each as dot_c computes
   it alone: one query's 16 dot products, the 16 rows' loads in flight together (a one-token step, which waits on memory) */
AVX512 static inline __m512 dots16_512(const float* q, const float* k, size_t row, int count, int hd) {
  __m512 a[LANES];
  const float* kr[LANES]; /* slots past count read the last one again (their lanes are not stored): no branch per slot */
#pragma GCC unroll 16
  for (int i = 0; i < LANES; i++) {
    a[i] = _mm512_setzero_ps();
    kr[i] = k + (size_t)(i < count ? i : count - 1) * row;
  }
  for (int d = 0; d < hd; d += LANES) { /* q's chunk loaded once for the 16 rows; each row's sum still in chunk order */
    const __mmask16 m = first_512(hd - d);
    const __m512 qv = _mm512_maskz_loadu_ps(m, q + d);
#pragma GCC unroll 16
    for (int i = 0; i < LANES; i++) a[i] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(m, kr[i] + d), a[i]);
  }
  return trees16_512(a);
}

/* dot(qa, k_i) in lane i and dot(qb, k_i) in lane 8 + i, for slots i < 8 of rows `row` floats apart (ca, cb: the slots
   each query sees, >= 1; the other lanes undefined), each as dot_c computes it alone: each K chunk is loaded once for
   both queries (two query heads of a token share a KV head), halving the loads per fma of one query at a time */
AVX512 static inline __m512 dots2x8_512(const float* qa, const float* qb, const float* k, size_t row, int ca, int cb, int hd) {
  __m512 a[LANES];
  const int c = ca > cb ? ca : cb;
  const float* kr[8]; /* slots past c read the last one again (their lanes are not stored): no branch per slot */
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    a[i] = a[i + 8] = _mm512_setzero_ps();
    kr[i] = k + (size_t)(i < c ? i : c - 1) * row;
  }
  for (int d = 0; d < hd; d += LANES) { /* each row's sum still in chunk order */
    const __mmask16 m = first_512(hd - d);
    const __m512 qva = _mm512_maskz_loadu_ps(m, qa + d), qvb = _mm512_maskz_loadu_ps(m, qb + d);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
      const __m512 kv = _mm512_maskz_loadu_ps(m, kr[i] + d);
      a[i] = _mm512_fmadd_ps(qva, kv, a[i]);
      a[i + 8] = _mm512_fmadd_ps(qvb, kv, a[i + 8]);
    }
  }
  return trees16_512(a);
}

/* dots2x8_512 where both queries see all 8 slots and hd is a multiple of 16: no masks, and the 8 rows addressed from two
   pointers and the row stride, so the 16 accumulators and the loop fit the registers (8 row pointers and a mask a
   chunk were spilled), and each K vector is loaded once for both fmas (GCC would fold a load into each) */
AVX512 static inline __m512 dots2x8_full_512(const float* qa, const float* qb, const float* k, size_t row, int hd) {
  __m512 a[LANES];
#pragma GCC unroll 16
  for (int i = 0; i < LANES; i++) a[i] = _mm512_setzero_ps();
  const size_t r1 = row * sizeof(float), r3 = 3 * r1;
  const char *k0 = (const char*)k, *k4 = (const char*)(k + 4 * row);
  for (int d = 0; d < hd; d += LANES, k0 += LANES * sizeof(float), k4 += LANES * sizeof(float)) {
    const __m512 qva = _mm512_loadu_ps(qa + d), qvb = _mm512_loadu_ps(qb + d);
    const char* kr[8] = {k0, k0 + r1, k0 + 2 * r1, k0 + r3, k4, k4 + r1, k4 + 2 * r1, k4 + r3};
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
      __m512 kv = _mm512_loadu_ps((const float*)kr[i]);
      __asm__("" : "+v"(kv));
      a[i] = _mm512_fmadd_ps(qva, kv, a[i]);
      a[i + 8] = _mm512_fmadd_ps(qvb, kv, a[i + 8]);
    }
  }
  return trees16_512(a);
}

/* [a[0..8), b[0..8)] */
AVX512 static inline __m512 pair_512(const float* a, const float* b) {
  const __m512d lo = _mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(a)));
  return _mm512_castpd_ps(_mm512_insertf64x4(lo, _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}

/* dots2x8_512's result where hd is 32 (64 was slower: twice the K loads, and the packing), its first tree
   level without shuffles: each chunk's accumulator is kept as its two 8-lane halves, qa's and qb's side by side
   ([qa's lanes l, qb's lanes l] times a K half broadcast to both), so [lo + hi] is b[slot] of trees16_512 for the
   dots (qa, slot), (qb, slot), with each lane's fmas and its first add the same operations in the same order */
AVX512 static inline __m512 dots2x8_halves_512(const float* qa, const float* qb, const float* k, size_t row, int ca, int cb, int hd) {
  __m512 lo[8], hi[8], qlo[4], qhi[4];
  const int c = ca > cb ? ca : cb;
  const float* kr[8]; /* slots past c read the last one again (their lanes are not stored) */
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) {
    lo[i] = hi[i] = _mm512_setzero_ps();
    kr[i] = k + (size_t)(i < c ? i : c - 1) * row;
  }
  const int chunks = hd / LANES;
  for (int x = 0; x < chunks; x++) { /* [qa lanes 0-7, qb lanes 0-7] and the same for lanes 8-15 of chunk x */
    qlo[x] = pair_512(qa + 16 * x, qb + 16 * x);
    qhi[x] = pair_512(qa + 16 * x + 8, qb + 16 * x + 8);
  }
  for (int x = 0; x < chunks; x++) {
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
      const __m512 kl = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double*)(kr[i] + 16 * x))));
      const __m512 kh = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd((const double*)(kr[i] + 16 * x + 8))));
      lo[i] = _mm512_fmadd_ps(qlo[x], kl, lo[i]);
      hi[i] = _mm512_fmadd_ps(qhi[x], kh, hi[i]);
    }
  }
  __m512 b[8];
#pragma GCC unroll 8
  for (int i = 0; i < 8; i++) b[i] = _mm512_add_ps(lo[i], hi[i]); /* dot 2i = (qa, slot i), dot 2i + 1 = (qb, slot i) */
  return trees16_rest_512(b, _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15));
}

/* dots2x8_512's result by the fastest of the ways above that this call allows */
AVX512 static inline __m512 dots_pair_512(const float* qa, const float* qb, const float* k, size_t row, int ca, int cb, int hd) {
  if (hd == 32) return dots2x8_halves_512(qa, qb, k, row, ca, cb, hd);
  if (ca == 8 && cb == 8 && hd % LANES == 0) return dots2x8_full_512(qa, qb, k, row, hd);
  return dots2x8_512(qa, qb, k, row, ca, cb, hd);
}

/* o += e[j] * v_j for slots j0 <= j < j1 (rows `row` floats apart), o held in registers over the slots: per lane the
   fmas axpy_c does, in the same order */
AVX512 static inline void softmax_512(float* s, int n) {
  __m512 mx = _mm512_set1_ps(-INFINITY), acc = _mm512_setzero_ps();
  for (int j = 0; j < n; j += LANES) mx = _mm512_max_ps(_mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), first_512(n - j), s + j), mx);
  const __m512 m = _mm512_set1_ps(tree_512(mx, 1));
  for (int j = 0; j < n; j += LANES) {
    const __mmask16 valid = first_512(n - j);
    const __m512 e = _mm512_maskz_mov_ps(valid, exp_512(_mm512_sub_ps(_mm512_maskz_loadu_ps(valid, s + j), m)));
    acc = _mm512_add_ps(acc, e);
    _mm512_mask_storeu_ps(s + j, valid, e);
  }
  const __m512 sum = _mm512_set1_ps(tree_512(acc, 0));
  for (int j = 0; j < n; j += LANES) {
    const __mmask16 valid = first_512(n - j);
    _mm512_mask_storeu_ps(s + j, valid, _mm512_div_ps(_mm512_maskz_loadu_ps(valid, s + j), sum));
  }
}

#define VALUES_512(NV)                                                                                               \
  for (int j = j0; j < j1; j++) {                                                                                  \
    const __m512 w = _mm512_set1_ps(e[j]);                                                                         \
    const float* vr = v + j * row + d;                                                                             \
    for (int x = 0; x < NV; x++) o[x] = _mm512_fmadd_ps(w, _mm512_maskz_loadu_ps(m[x], vr + 16 * x), o[x]);         \
  }
AVX512 static inline void values_512(const float* e, const float* v, size_t row, int j0, int j1, float* out, int hd) {
  for (int d = 0; d < hd; d += 4 * LANES) {
    const int nv = (hd - d + LANES - 1) / LANES; /* vectors in this chunk: 1..4 (and more chunks after a 4) */
    __mmask16 m[4];
    __m512 o[4];
    for (int x = 0; x < 4; x++) {
      m[x] = first_512(hd - d - 16 * x);
      o[x] = _mm512_maskz_loadu_ps(m[x], out + d + 16 * x);
    }
    if (nv == 1) VALUES_512(1)
    else if (nv == 2) VALUES_512(2)
    else if (nv == 3) VALUES_512(3)
    else VALUES_512(4)
    for (int x = 0; x < 4; x++) _mm512_mask_storeu_ps(out + d + 16 * x, m[x], o[x]);
  }
}


/* the same for R query rows at once over slots [j0, j1) that every one of them sees: each V row loaded once for the R
   rows, R x NV accumulators in registers (hd = 16 NV; R x NV = 16, 20 or 24 in VALUES_ROWS_EACH_512). Per lane and row:
   axpy_c's fmas in slot order */
#define VALUES_ROWS_512(R, NV)                                                                                       \
  {                                                                                                                \
    __m512 acc[R][NV];                                                                                             \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                           \
      _Pragma("GCC unroll 16") for (int x = 0; x < NV; x++) acc[r][x] = _mm512_loadu_ps(o[r] + 16 * x);            \
    for (int j = j0; j < j1; j++) {                                                                                \
      const float* vr = v + j * row;                                                                               \
      __m512 vv[NV];                                                                                               \
      _Pragma("GCC unroll 16") for (int x = 0; x < NV; x++) {                                                         \
        vv[x] = _mm512_loadu_ps(vr + 16 * x);                                                                      \
        __asm__("" : "+v"(vv[x])); /* held in a register: the compiler would load it again for every row */        \
      }                                                                                                            \
      _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) {                                                       \
        const __m512 w = _mm512_set1_ps(e[r][j]);                                                                  \
        _Pragma("GCC unroll 16") for (int x = 0; x < NV; x++) acc[r][x] = _mm512_fmadd_ps(w, vv[x], acc[r][x]);     \
      }                                                                                                            \
    }                                                                                                              \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                           \
      _Pragma("GCC unroll 16") for (int x = 0; x < NV; x++) _mm512_storeu_ps(o[r] + 16 * x, acc[r][x]);           \
  }
/* the same where R x NV accumulators leave no room for a V row's NV vectors: each V vector loaded in turn for the R rows */
#define VALUES_ROWS_EACH_512(R, NV)                                                                                  \
  {                                                                                                                \
    __m512 acc[R][NV];                                                                                             \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                           \
      _Pragma("GCC unroll 16") for (int x = 0; x < NV; x++) acc[r][x] = _mm512_loadu_ps(o[r] + 16 * x);            \
    for (int j = j0; j < j1; j++) {                                                                                \
      const float* vr = v + j * row;                                                                               \
      __m512 w[R];                                                                                                 \
      _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) w[r] = _mm512_set1_ps(e[r][j]);                         \
      _Pragma("GCC unroll 16") for (int x = 0; x < NV; x++) {                                                      \
        __m512 vv = _mm512_loadu_ps(vr + 16 * x);                                                                  \
        __asm__("" : "+v"(vv)); /* loaded once for the R rows */                                                   \
        _Pragma("GCC unroll 16") for (int r = 0; r < R; r++) acc[r][x] = _mm512_fmadd_ps(w[r], vv, acc[r][x]);      \
      }                                                                                                            \
    }                                                                                                              \
    _Pragma("GCC unroll 16") for (int r = 0; r < R; r++)                                                           \
      _Pragma("GCC unroll 16") for (int x = 0; x < NV; x++) _mm512_storeu_ps(o[r] + 16 * x, acc[r][x]);           \
  }
AVX512 static void values_rows_512(int R, const float* const* e, float* const* o, const float* v, size_t row, int j0, int j1, int hd) {
  if (hd == 32) {
    if (R == 10) VALUES_ROWS_EACH_512(10, 2)
    else if (R == 8) VALUES_ROWS_512(8, 2)
    else if (R == 4) VALUES_ROWS_512(4, 2)
    else VALUES_ROWS_512(2, 2)
  } else if (hd == 64) {
    if (R == 4) VALUES_ROWS_512(4, 4)
    else VALUES_ROWS_512(2, 4)
  } else if (R == 3)
    VALUES_ROWS_EACH_512(3, 8)
  else
    VALUES_ROWS_512(2, 8)
}

/* rows [0, R) of a values pass over [j0, ends[r]): together over the slots all of them see, then each alone */
AVX512 static void values_group_512(int R, const float* const* e, float* const* o, const int* ends, const float* v, size_t row, int j0, int hd) {
  int common = ends[0];
  for (int r = 1; r < R; r++) common = ends[r] < common ? ends[r] : common;
  values_rows_512(R, e, o, v, row, j0, common, hd);
  for (int r = 0; r < R; r++) values_512(e[r], v, row, common, ends[r], o[r], hd);
}

/* the most query rows a values_rows_512 call takes for this head_dim (and halves of it down to 2; 2 after 3, 8 after
   10), or 0 where it takes none: 10 x 2 and 3 x 8 accumulators and their weights are what the 32 registers hold */
static inline int rows_together(int hd) { return hd == 32 ? 10 : hd == 64 ? 4 : hd == 128 ? 3 : 0; }


/* dot(q, k) alone, as dots16_512 computes each of its sixteen (for a tree token's own slots, TREE_DOTS) */
AVX512 static inline float dot1_512(const float* q, const float* k, int hd) {
  __m512 acc = _mm512_setzero_ps();
  for (int d = 0; d < hd; d += LANES) {
    const __mmask16 m = first_512(hd - d);
    acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + d), _mm512_maskz_loadu_ps(m, k + d), acc);
  }
  return tree_512(acc, 0);
}

/* o += w * v over the head (for a tree token's own slots, TREE_VALUES) */
AVX512 static inline void axpy1_512(float w, const float* v, float* o, int hd) { values_512(&w, v, 0, 0, 1, o, hd); }

/* AVX-512: the same arithmetic per (token, head), the query rows' dot products in pairs over 8 slots at a time, and the
   value pass over blocks of SLOT_BLOCK slots (their V rows stay in cache while it goes over the task's tokens and heads) */
enum { SLOT_BLOCK = 64, PF_K = 2 /* 16 PF_K slots ahead: where the K pass prefetches */ };
AVX512 void task_avx512(const attn_problem* p, size_t i) {
  TASK_SETUP
  const __m512 scale = _mm512_set1_ps(p->scale);
  const size_t span = (size_t)per * hd; /* floats of a row the task reads */
  for (int J = 0; J < N; J += LANES) {
    /* the slots a few blocks ahead into L1: a block's rows lie a whole cache row apart, which no hardware prefetcher follows */
    for (int j = J + PF_K * LANES; j < J + (PF_K + 1) * LANES && j < N; j++)
      for (size_t f = 0; f < span; f += 16) _mm_prefetch((const char*)(K + j * row + f), _MM_HINT_T1);
    if (S == 1) { /* one token: a query's 16 slots at a time (its K rows are in memory, not in cache: more loads in flight) */
      const int count = N - J < LANES ? N - J : LANES;
      for (int x = 0; x < hs; x++) {
        const __m512 dots = dots16_512(p->q + (b * p->heads + g0 * G + x) * hd, K + J * row + (size_t)(x / G) * hd, row, count, hd);
        _mm512_mask_storeu_ps(scores + (size_t)x * seen[0] + J, first_512(count), _mm512_mul_ps(dots, scale));
      }
      continue;
    }
    for (int j0 = J; j0 < J + LANES && j0 < N; j0 += 8) /* (the loop below, for each of the block's two halves) */
    for (int g = 0; g < per; g++) { /* a KV head's 8 K rows stay in L1 over the tokens and query heads, taken in pairs */
      const float* q2[2];
      float* o2[2];
      int c2[2], pending = 0;
      float* sc = scores;
      for (int s = 0; s < S; s++) {
        const int n = seen[s];
        if (j0 < cached[s]) {
          const int count = cached[s] - j0 < 8 ? cached[s] - j0 : 8;
          const float* q = p->q + ((b * S + s) * p->heads + g0 * G) * hd;
          for (int h = 0; h < G; h++) {
            q2[pending] = q + (size_t)(g * G + h) * hd;
            o2[pending] = sc + (size_t)(g * G + h) * n + j0;
            c2[pending++] = count;
            if (pending == 2) {
              const __m512 dots = _mm512_mul_ps(dots_pair_512(q2[0], q2[1], K + j0 * row + (size_t)g * hd, row, c2[0], c2[1], hd), scale);
              _mm512_mask_storeu_ps(o2[0], first_512(c2[0]), dots);
              _mm512_mask_storeu_ps(o2[1], first_512(c2[1]), _mm512_shuffle_f32x4(dots, dots, _MM_SHUFFLE(3, 2, 3, 2)));
              pending = 0;
            }
          }
        }
        sc += (size_t)hs * n;
      }
      if (pending) /* an odd row out: its pair is itself */
        _mm512_mask_storeu_ps(o2[0], first_512(c2[0]),
                              _mm512_mul_ps(dots_pair_512(q2[0], q2[0], K + j0 * row + (size_t)g * hd, row, c2[0], c2[0], hd), scale));
    }
  }
  TREE_DOTS(dot1_512)
  SOFTMAX_PASS(softmax_512)
  const int R = rows_together(hd) ? rows_together(hd) : 1; /* (1: every row alone) */
  for (int j0 = 0; j0 < N; j0 += SLOT_BLOCK) {
    for (int j = j0 + SLOT_BLOCK; j < j0 + 2 * SLOT_BLOCK && j < N; j++) /* the next block's V rows into L2 */
      for (size_t f = 0; f < span; f += 16) _mm_prefetch((const char*)(V + j * row + f), _MM_HINT_T1);
    for (int g = 0; g < per; g++) { /* and its SLOT_BLOCK V rows, for the query rows in groups of R */
      const float* e[10];
      float* o[10];
      int ends[10], pending = 0; /* R <= 10 */
      float* sc = scores;
      for (int s = 0; s <= S; s++) {
        const int n = s < S ? seen[s] : 0, c = s < S ? cached[s] : 0;
        for (int h = 0; h < G && j0 < c; h++) { /* row (s, h): its probabilities, its output, its last slot in the block */
          e[pending] = sc + (size_t)(g * G + h) * n;
          o[pending] = p->out + ((b * S + s) * p->heads + (g0 + g) * G + h) * hd;
          ends[pending++] = c < j0 + SLOT_BLOCK ? c : j0 + SLOT_BLOCK;
          if (pending == R) {
            if (R == 1) values_512(e[0], V + (size_t)g * hd, row, j0, ends[0], o[0], hd);
            else values_group_512(R, e, o, ends, V + (size_t)g * hd, row, j0, hd);
            pending = 0;
          }
        }
        if (s == S) { /* the rows left over: in groups of R / 2, R / 4, ... 2 (2 after 3, 8 after 10), then alone */
          int r = 0;
          for (int size = R == 3 ? 2 : R == 10 ? 8 : R / 2; size >= 2; size /= 2)
            for (; pending - r >= size; r += size) values_group_512(size, e + r, o + r, ends + r, V + (size_t)g * hd, row, j0, hd);
          for (; r < pending; r++) values_512(e[r], V + (size_t)g * hd, row, j0, ends[r], o[r], hd);
        }
        sc += (size_t)hs * n;
      }
    }
  }
  TREE_VALUES(axpy1_512)
}
#endif
