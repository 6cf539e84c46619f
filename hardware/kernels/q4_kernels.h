/* int4 and int8 x int8 GEMMs for specdec's CPU engines: the kernels behind the ai.specdec.cpu Q4Gemm and Q8Gemm ops.
 *
 * y[m, n] = sum over groups g of  sa[m, g] * sw[n, g] * (sum over k in g of (w[k, n] - z[n, g]) * qa[m, k])
 *
 * qa: the activations as int8, per row and group (scale sa = amax / 127), so the inner sums are exact integers
 * and only the per-group float terms round. Every row takes the same instructions in the same order whatever
 * the row count, its position in the call and the thread that runs its columns: a row's bits never depend on
 * the call's shape. That is what lets a one-token step and a (k + 1)-token verification give identical logits
 * without padding (docs/precision.md). The AVX-512 VNNI, AVX2 and portable kernels compute the same bits.
 *
 * Weight layout (LAYOUT 2 in hardware/cpu_kernels.py), per 16-column tile and group, 64-byte blocks:
 *   int4: [N / 16][G][group / 8][64]: byte (c * 4 + j) of block p holds, for column c of the tile, k = 8p + j in
 *         its low nibble and k = 8p + 4 + j in its high one;
 *   int8: [N / 16][G][group / 4][64]: byte (c * 4 + j) of block q holds column c's code for k = 4q + j.
 * Scales sw: [N / 16][G][16] float32. Zero points zw: [N / 16][G][16] int32, or one int32 that every column and
 * group shares (symmetric weights: 8 or 128), which the engine then does not store per column.
 */
#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef struct {
  int M, K, N, group;
  const int8_t* qa;    /* [M, K] */
  const float* sa;     /* [M, G] */
  const int32_t* asum; /* [M, G]: sum of each group's codes (the zero point's share) */
  const uint8_t* w;
  const float* sw;
  const int32_t* zw;
  int zw_shared;       /* zw is one value for every column and group */
  float* y;            /* [M, N] */
  int stream;          /* the weights lie in 2 MiB pages (ort_q4gemm.c): 1 row reads them as one stream (q4_kernels.c) */
} q_problem;

enum { KERNEL_PORTABLE = 0, KERNEL_AVX2 = 1, KERNEL_VNNI = 2 };
/* the kernel this CPU runs (or the slower one $SPECDEC_Q4_KERNEL names) */
int q_kernel(void);
/* which kernel runs here: "AVX-512 VNNI", "AVX2" or "portable C" */
const char* q4_kernel_name(void);

/* A group's term into the outputs: y = fma(float(dot - z * asum), sw * sa, y), y taken as 0 at the first group. The
   int4 and int8 kernels share it (one place for the arithmetic whose bits they must agree on). rg: the row's
   index into sa and asum for the group, s: the column's (or 16 / 8 columns') index into sw and zw. */
static inline float q_group_term(const q_problem* p, int32_t dot, size_t rg, size_t s, float acc) {
  dot -= p->zw[p->zw_shared ? 0 : s] * p->asum[rg];
  return fmaf((float)dot, p->sw[s] * p->sa[rg], acc);
}

#if defined(__x86_64__)
#include <immintrin.h>
/* the same for 16 columns (as, ss: the row's asum and sa for group g, broadcast) */
__attribute__((target("avx512f,avx512bw,avx512vnni"), always_inline)) static inline void q_group_out_512(
    const q_problem* p, __m512i dot, __m512i as, __m512 ss, size_t s, int g, float* y) {
  const __m512i z = p->zw_shared ? _mm512_set1_epi32(p->zw[0]) : _mm512_loadu_si512(p->zw + s);
  const __m512i d = _mm512_sub_epi32(dot, _mm512_mullo_epi32(z, as));
  const __m512 acc = g ? _mm512_loadu_ps(y) : _mm512_setzero_ps();
  _mm512_storeu_ps(y, _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(_mm512_loadu_ps(p->sw + s), ss), acc));
}

/* An AVX2 pass over R rows x H halves (8 columns each) of tile t from half h0, for int4 (INT8 = 0) or int8 weights:
   the same loads, unpacking and epilogue, and each width's own exact integer dot (q4_kernels.c and q8_kernels.c say
   why each equals vpdpbusd's). INT8 is a constant in every caller, so each width compiles to its own loop.
   maddubs leaves int16 pair sums; they are added up in int16 over a run of 4 blocks and widened to int32 (madd with
   ones) once a run, not once a block: fewer vector operations a block (the loop is bound by the vector pipes). Exact:
   a maddubs lane is 2 codes (0..15: int4 codes, or an int8 code's nibbles) x int8 activations, at most
   2 x 15 x 128 = 3840 in magnitude, so a run's int4 low + high sums (4 x 7680 = 30720) or int8 low or high ones
   (4 x 3840) stay below 32767: the int16 sums never wrap. (int8 could take runs of 8, but its two sums a row then
   overflow AVX2's 16 registers.) */
/* n blocks of one run from src (64 bytes apart), row r's activations from a[r] + at: the int16 sums into lo16 (and
   int8's high nibbles' into hi16). n is RUN in every run but a group's last, so the full runs compile unrolled. */
__attribute__((target("avx2,fma"), always_inline)) static inline void q_run_avx2(const uint8_t* src, const int8_t* const a[6], int at, const int n,
    const int R, const int H, const int INT8, size_t prefetch, __m256i lo16[6][2], __m256i hi16[6][2]) {
  const __m256i low = _mm256_set1_epi8(0x0F);
  for (int q = 0; q < n; q++, src += 64) {
    if (prefetch) _mm_prefetch((const char*)src + prefetch, _MM_HINT_T1);
    __m256i lo[2], hi[2];
    for (int h = 0; h < H; h++) {
      const __m256i b = _mm256_loadu_si256((const __m256i*)(src + 32 * h));
      lo[h] = _mm256_and_si256(b, low);
      hi[h] = _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
    }
    for (int r = 0; r < R; r++) {
      int32_t a0, a1;
      memcpy(&a0, a[r] + at + q * (INT8 ? 4 : 8), 4);
      if (INT8) { /* a code's two nibbles by the same activations */
        const __m256i x = _mm256_set1_epi32(a0);
        for (int h = 0; h < H; h++) {
          lo16[r][h] = _mm256_add_epi16(lo16[r][h], _mm256_maddubs_epi16(lo[h], x));
          hi16[r][h] = _mm256_add_epi16(hi16[r][h], _mm256_maddubs_epi16(hi[h], x));
        }
      } else { /* the low nibbles hold k = 8q + j, the high ones k = 8q + 4 + j */
        memcpy(&a1, a[r] + at + q * 8 + 4, 4);
        const __m256i x0 = _mm256_set1_epi32(a0), x1 = _mm256_set1_epi32(a1);
        for (int h = 0; h < H; h++)
          lo16[r][h] = _mm256_add_epi16(lo16[r][h], _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], x0), _mm256_maddubs_epi16(hi[h], x1)));
      }
    }
  }
}

__attribute__((target("avx2,fma"), always_inline)) static inline void q_tile_avx2(const q_problem* p, const int R, const int H, int h0,
                                                                                   int r0, int t, const int INT8) {
  /* the problem's fields as locals: the output stores (unaligned vector stores may alias anything) would otherwise
     reload them for every row */
  const int K = p->K, N = p->N, group = p->group, G = K / group, B = group / (INT8 ? 4 : 8); /* 64-byte blocks per group */
  const int8_t* const qa = p->qa;
  const float *const sa = p->sa, *const sw = p->sw;
  const int32_t *const asum = p->asum, *const zw = p->zw;
  const int zw_shared = p->zw_shared;
  float* const y = p->y;
  enum { RUN = 4 }; /* blocks summed in int16 (above) */
  const size_t tile_bytes = (size_t)G * B * 64, tile_scales = (size_t)G * 16;
  /* the next tile into L2 while this one computes, once per tile (by the pass over its first half) */
  const size_t prefetch = h0 == 0 && t + 1 < N / 16 ? tile_bytes : 0;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* w0 = p->w + (size_t)t * tile_bytes + 32 * h0;
  enum { GROUPS = 8 }; /* groups whose integer sums are kept for one float epilogue (off the integer loop's path) */
  for (int g0 = 0; g0 < G; g0 += GROUPS) {
    const int g1 = g0 + GROUPS < G ? g0 + GROUPS : G;
    __m256i dots[GROUPS][6][2];
    for (int g = g0; g < g1; g++) {
      const int8_t* a[6];
      for (int r = 0; r < R; r++) a[r] = qa + (size_t)(r0 + r) * K + (size_t)g * group;
      __m256i dot[6][2];
      for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) dot[r][h] = _mm256_setzero_si256();
      for (int q0 = 0; q0 < B; q0 += RUN) {
        __m256i lo16[6][2], hi16[6][2]; /* int16 pair sums of the run; hi16: int8's high nibbles' only */
        for (int r = 0; r < R; r++)
          for (int h = 0; h < H; h++) lo16[r][h] = hi16[r][h] = _mm256_setzero_si256();
        const uint8_t* src = w0 + ((size_t)g * B + q0) * 64;
        const int at = q0 * (INT8 ? 4 : 8); /* the run's first activation */
        if (q0 + RUN <= B) q_run_avx2(src, a, at, RUN, R, H, INT8, prefetch, lo16, hi16);
        else q_run_avx2(src, a, at, B - q0, R, H, INT8, prefetch, lo16, hi16);
        for (int r = 0; r < R; r++)
          for (int h = 0; h < H; h++) {
            __m256i d = _mm256_madd_epi16(lo16[r][h], ones); /* int8: sum(lo * a) + 16 x sum(hi * a) */
            if (INT8) d = _mm256_add_epi32(d, _mm256_slli_epi32(_mm256_madd_epi16(hi16[r][h], ones), 4));
            dot[r][h] = _mm256_add_epi32(dot[r][h], d);
          }
      }
      for (int r = 0; r < R; r++)
        for (int h = 0; h < H; h++) dots[g - g0][r][h] = dot[r][h];
    }
    /* each column's group terms into y in group order: q_group_term's operations, 8 columns at a time; the rows' and
       halves' chains of fmas interleaved (one at a time would wait on each fma's latency) */
    __m256 acc[6][2];
    for (int r = 0; r < R; r++)
      for (int h = 0; h < H; h++)
        acc[r][h] = g0 ? _mm256_loadu_ps(y + (size_t)(r0 + r) * N + (size_t)t * 16 + 8 * (h0 + h)) : _mm256_setzero_ps();
    for (int g = g0; g < g1; g++)
      for (int r = 0; r < R; r++) {
        const size_t rg = (size_t)(r0 + r) * G + g;
        const __m256 ss = _mm256_set1_ps(sa[rg]);
        for (int h = 0; h < H; h++) {
          const size_t s = (size_t)t * tile_scales + (size_t)g * 16 + 8 * (h0 + h);
          /* z * asum, wrapping as vpmulld does (a row with a NaN or inf, whose outputs are NaN, has any asum) */
          const __m256i zs = zw_shared ? _mm256_set1_epi32((int32_t)((uint32_t)zw[0] * (uint32_t)asum[rg]))
                                       : _mm256_mullo_epi32(_mm256_loadu_si256((const __m256i*)(zw + s)), _mm256_set1_epi32(asum[rg]));
          const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(sw + s), ss);
          acc[r][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dots[g - g0][r][h], zs)), scale, acc[r][h]);
        }
      }
    for (int r = 0; r < R; r++)
      for (int h = 0; h < H; h++) _mm256_storeu_ps(y + (size_t)(r0 + r) * N + (size_t)t * 16 + 8 * (h0 + h), acc[r][h]);
  }
}

/* A call's passes, the same for int4 and int8 weights. AVX-512 VNNI: up to 8 rows x 4 tiles a pass,
   by_rows[R] = R rows x {4, 2, 1} tiles (5-8 rows take at most 2). */
typedef void (*q_tile_fn)(const q_problem* p, int r0, int t);
static inline void q_vnni_passes(const q_problem* p, int t_begin, int t_end, const q_tile_fn by_rows[9][3]) {
  for (int t = t_begin; t < t_end; t += 4) {
    const int tiles = t_end - t < 4 ? t_end - t : 4;
    for (int r0 = 0; r0 < p->M; r0 += 8) {
      const int R = p->M - r0 < 8 ? p->M - r0 : 8;
      int i = R <= 4 ? 0 : 1;
      for (int tt = t; tt < t + tiles;) {
        while (tt + (4 >> i) > t + tiles) i++;
        by_rows[R][i](p, r0, tt);
        tt += 4 >> i;
      }
    }
  }
}

/* AVX2: up to 6 rows of one tile a pass, by_rows[R] = R rows x 2 halves from h0 (up to ``both`` rows: int4 6, int8 2)
   or one (the rest: two passes) */
typedef void (*q_half_fn)(const q_problem* p, int h0, int r0, int t);
static inline void q_avx2_passes(const q_problem* p, int t_begin, int t_end, const q_half_fn by_rows[7], const int both) {
  for (int t = t_begin; t < t_end; t++)
    for (int r0 = 0; r0 < p->M; r0 += 6) {
      const int R = p->M - r0 < 6 ? p->M - r0 : 6;
      if (R <= both) by_rows[R](p, 0, r0, t);
      else for (int h = 0; h < 2; h++) by_rows[R](p, h, r0, t);
    }
}
#endif

/* A node's weight inputs copied once into 2 MiB pages (large_pages.c): q_weights_in_large_pages swaps parts[0..count)
   (w, scales, zero points) for the copy's and returns 1 where it holds them (in huge pages: q_problem.stream), else
   leaves them and returns 0. Zero-initialized with the node's kernel; q_weight_copy_release when it is destroyed. */
enum { Q_COPY_PARTS = 3 };
typedef struct {
  int state, count;
  const void* src[Q_COPY_PARTS];
  const void* copy[Q_COPY_PARTS];
  struct Chunk* chunk; /* where the copy lies (large_pages.c) */
} q_weight_copy;
int q_weights_in_large_pages(q_weight_copy* c, const void** parts, const size_t* bytes, int count);
void q_weight_copy_release(q_weight_copy* c);

void q4_quantize_rows(const float* x, int M, int K, int group, int8_t* qa, float* sa, int32_t* asum);
/* columns [16 * t_begin, 16 * t_end) of every row: int4 weights (q4_kernels.c), int8 weights (q8_kernels.c) */
void q4_gemm_tiles(const q_problem* p, int t_begin, int t_end);
void q8_gemm_tiles(const q_problem* p, int t_begin, int t_end);
/* y[m, c] = silu(gate[m, c]) * up[m, c] for columns [c_begin, c_end) of M rows: gate's and up's rows ld_in floats apart,
   y's ld (swiglu.c) */
void swiglu_rows(const float* gate, const float* up, int ld_in, float* y, int ld, int M, int c_begin, int c_end);
