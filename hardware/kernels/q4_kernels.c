/* int4 weights (see q4_kernels.h), the activations' quantization and the choice of kernel. Compiled by
 * hardware/cpu_kernels.py with -O3 -ffp-contract=off -fno-fast-math (no fused multiply-adds but the explicit ones,
 * so that every kernel rounds alike). */
#include "q4_kernels.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static void quantize_portable(const float* x, int M, int K, int group, int8_t* qa, float* sa, int32_t* asum) {
  const int G = K / group;
  for (int r = 0; r < M; r++) {
    for (int g = 0; g < G; g++) {
      const float* xs = x + (size_t)r * K + (size_t)g * group;
      float amax = 0.f;
      int finite = 1;
      for (int i = 0; i < group; i++) {
        const float a = fabsf(xs[i]);
        finite &= a <= FLT_MAX; /* false for inf and NaN */
        amax = a > amax ? a : amax;
      }
      float inv = 127.f / amax;
      if (!finite || !(inv <= FLT_MAX)) inv = 0.f; /* all zeros, or a group too small to scale: codes 0 */
      int8_t* q = qa + (size_t)r * K + (size_t)g * group;
      int32_t sum = 0;
      for (int i = 0; i < group; i++) {
        const int v = (int)nearbyintf(xs[i] * inv); /* round half to even: the default rounding mode */
        q[i] = (int8_t)v;
        sum += v;
      }
      sa[(size_t)r * G + g] = finite ? amax / 127.f : NAN; /* a non-finite input makes its row's outputs NaN */
      asum[(size_t)r * G + g] = sum;
    }
  }
}

/* -- portable kernel: the reference, and the fallback on CPUs without AVX-512 VNNI --------------------------- */


static void gemm_portable(const q_problem* p, int t_begin, int t_end) {
  const int G = p->K / p->group, P = p->group / 8;
  for (int t = t_begin; t < t_end; t++) {
    for (int r = 0; r < p->M; r++) {
      for (int c = 0; c < 16; c++) {
        float acc = 0.f;
        for (int g = 0; g < G; g++) {
          int32_t dot = 0;
          const uint8_t* wb = p->w + (((size_t)t * G + g) * P) * 64;
          const int8_t* a = p->qa + (size_t)r * p->K + (size_t)g * p->group;
          for (int q = 0; q < P; q++)
            for (int j = 0; j < 4; j++) {
              const uint8_t b = wb[q * 64 + c * 4 + j];
              dot += (int32_t)(b & 0x0F) * a[q * 8 + j] + (int32_t)(b >> 4) * a[q * 8 + 4 + j];
            }
          const size_t s = ((size_t)t * G + g) * 16 + c;
          acc = q_group_term(p, dot, (size_t)r * G + g, s, acc);
        }
        p->y[(size_t)r * p->N + (size_t)t * 16 + c] = acc;
      }
    }
  }
}

/* -- AVX-512 VNNI: R rows x CT tiles of 16 columns per pass ----------------------------------------------------
   Each 64-byte weight block is loaded and unpacked once for all R rows of a pass: the low nibbles with one AND
   (codes 0..15), the high ones with another AND left in place (16 x code: their sums are 16 x the true sums,
   exactly, and are shifted back once per group), so a block costs 2 ANDs + 2R vpdpbusd. A group's partial sums
   then go into the output row in group order (y = fma(float(dot), sw * sa, y)): the same float operations in
   the same order whatever R and CT, so every row's bits are the same in any call.
   A call's rows go through in passes of up to 8 (a verification of up to 7 drafts is one pass: its weights are
   read and unpacked once); 1-2 rows take 4 column tiles a pass with the low/high split above, 3-4 rows 4 tiles and
   5-8 rows 2, with the high nibbles shifted down (one accumulator per row and tile: AVX-512's 32 registers). The
   next tiles' blocks are prefetched into L2 while a pass computes: the weight stream keeps going. */
#if defined(__x86_64__)
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

VNNI __attribute__((always_inline)) static inline void tile_vnni(const q_problem* p, const int R, const int CT, const int SPLIT, int r0, int t) {
  const int G = p->K / p->group, P = p->group / 8, tiles = p->N / 16;
  const size_t tile_bytes = (size_t)G * P * 64, tile_scales = (size_t)G * 16;
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
  const uint8_t* w0 = p->w + (size_t)t * tile_bytes;
  for (int g = 0; g < G; g++) {
    __m512i dlo[8][4], dhi[8][4]; /* integer sums per row and tile; dhi: the high nibbles' (x 16), SPLIT only */
    for (int r = 0; r < R; r++)
      for (int c = 0; c < CT; c++) dlo[r][c] = dhi[r][c] = _mm512_setzero_si512();
    const int8_t* a = p->qa + (size_t)r0 * p->K + (size_t)g * p->group;
    const uint8_t* wg = w0 + (size_t)g * P * 64;
    for (int q = 0; q < P; q++) {
      __m512i lo[4], hi[4];
      for (int c = 0; c < CT; c++) {
        const uint8_t* src = wg + (size_t)c * tile_bytes + (size_t)q * 64;
        if (t + c + CT < tiles) _mm_prefetch((const char*)src + CT * tile_bytes, _MM_HINT_T1);
        const __m512i b = _mm512_loadu_si512(src);
        lo[c] = _mm512_and_si512(b, low);
        hi[c] = SPLIT ? _mm512_and_si512(b, high) : _mm512_and_si512(_mm512_srli_epi16(b, 4), low);
      }
      for (int r = 0; r < R; r++) {
        int32_t a0, a1;
        memcpy(&a0, a + (size_t)r * p->K + q * 8, 4);
        memcpy(&a1, a + (size_t)r * p->K + q * 8 + 4, 4);
        const __m512i x0 = _mm512_set1_epi32(a0), x1 = _mm512_set1_epi32(a1);
        for (int c = 0; c < CT; c++) {
          dlo[r][c] = _mm512_dpbusd_epi32(dlo[r][c], lo[c], x0);
          if (SPLIT) dhi[r][c] = _mm512_dpbusd_epi32(dhi[r][c], hi[c], x1);
          else dlo[r][c] = _mm512_dpbusd_epi32(dlo[r][c], hi[c], x1);
        }
      }
    }
    for (int r = 0; r < R; r++) {
      const __m512i as = _mm512_set1_epi32(p->asum[(size_t)(r0 + r) * G + g]);
      const __m512 ss = _mm512_set1_ps(p->sa[(size_t)(r0 + r) * G + g]);
      for (int c = 0; c < CT; c++) {
        const size_t s = (size_t)(t + c) * tile_scales + (size_t)g * 16;
        float* y = p->y + (size_t)(r0 + r) * p->N + (size_t)(t + c) * 16;
        const __m512i dot = SPLIT ? _mm512_add_epi32(dlo[r][c], _mm512_srai_epi32(dhi[r][c], 4)) : dlo[r][c];
        q_group_out_512(p, dot, as, ss, s, g, y);
      }
    }
  }
}

#define TILE_FN(R, CT, S) \
  VNNI static void tile_##R##x##CT(const q_problem* p, int r0, int t) { tile_vnni(p, R, CT, S, r0, t); }
TILE_FN(1, 4, 1) TILE_FN(2, 4, 1) TILE_FN(3, 4, 0) TILE_FN(4, 4, 0) TILE_FN(5, 2, 0) TILE_FN(6, 2, 0) TILE_FN(7, 2, 0) TILE_FN(8, 2, 0)
TILE_FN(1, 2, 1) TILE_FN(2, 2, 1) TILE_FN(3, 2, 0) TILE_FN(4, 2, 0)
TILE_FN(1, 1, 1) TILE_FN(2, 1, 1) TILE_FN(3, 1, 0) TILE_FN(4, 1, 0) TILE_FN(5, 1, 0) TILE_FN(6, 1, 0) TILE_FN(7, 1, 0) TILE_FN(8, 1, 0)
/* [rows][4, 2, 1 column tiles] */
static const q_tile_fn tiles_by_rows[9][3] = {{0},
    {tile_1x4, tile_1x2, tile_1x1}, {tile_2x4, tile_2x2, tile_2x1}, {tile_3x4, tile_3x2, tile_3x1}, {tile_4x4, tile_4x2, tile_4x1},
    {0, tile_5x2, tile_5x1}, {0, tile_6x2, tile_6x1}, {0, tile_7x2, tile_7x1}, {0, tile_8x2, tile_8x1}};

/* Weights in 2 MiB pages (p->stream, ort_q4gemm.c's copy): one row takes one tile a pass, so a call's weights are read
   as one sequential stream (its tiles lie one after another). Measured (benchmarks/bench_q4_kernel.c --memory huge): on
   Zen 4 the hardware prefetcher alone then reads 1 row at about 95% of a plain read of the same pages, where 4 tiles a
   pass (4 streams and their prefetches) reach about 75%; 2-4 rows in one stream were no faster than their passes above
   (2 rows) or slower (3-4). An Intel core's L2 streamer stops at every 4 KiB boundary, huge page or not: on a Xeon with
   AVX-512 VNNI the stream alone read at 84% (the passes above at 94-95%), and with each block's line prefetched into L2
   4 KiB ahead (into the next 4 KiB region before the stream reaches it) at 102% (8 KiB: the same, 2 KiB: 99%, into L1:
   95%); the same prefetch in a plain read cost Zen 4 nothing (101-103% of the read without it). In 4 KiB pages the
   passes above, whose prefetches run a pass ahead, are the faster on Zen 4 (not measured on the Xeon).
   The low and high nibbles' sums and the even and odd blocks' are kept apart (four independent vpdpbusd chains). The
   integer sums are exact, so their order does not change them, and each group's term goes into y as above: the same
   bits. */
enum { STREAM_AHEAD = 4096 }; /* bytes ahead of the stream: the next 4 KiB region's line */
VNNI static void stream_1row(const q_problem* p, int t) {
  const int G = p->K / p->group, P = p->group / 8;
  const size_t tile_bytes = (size_t)G * P * 64, tile_scales = (size_t)G * 16;
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8((char)0xF0);
  const uint8_t* w0 = p->w + (size_t)t * tile_bytes;
  for (int g = 0; g < G; g++) {
    __m512i dlo[2], dhi[2]; /* [even, odd block] */
    dlo[0] = dlo[1] = dhi[0] = dhi[1] = _mm512_setzero_si512();
    const int8_t* a = p->qa + (size_t)g * p->group;
    const uint8_t* wg = w0 + (size_t)g * P * 64;
    for (int q = 0; q < P; q += 2)
      for (int u = 0; u < 2 && q + u < P; u++) { /* unrolled by 2: u is a constant in each copy */
        /* a hint, never a fault: past the call's weights it fetches whatever lies next (their scales, the next node's) */
        _mm_prefetch((const char*)(wg + (size_t)(q + u) * 64) + STREAM_AHEAD, _MM_HINT_T1);
        const __m512i b = _mm512_loadu_si512(wg + (size_t)(q + u) * 64);
        int32_t a0, a1;
        memcpy(&a0, a + (q + u) * 8, 4);
        memcpy(&a1, a + (q + u) * 8 + 4, 4);
        dlo[u] = _mm512_dpbusd_epi32(dlo[u], _mm512_and_si512(b, low), _mm512_set1_epi32(a0));
        dhi[u] = _mm512_dpbusd_epi32(dhi[u], _mm512_and_si512(b, high), _mm512_set1_epi32(a1));
      }
    const __m512i lo = _mm512_add_epi32(dlo[0], dlo[1]), hi = _mm512_add_epi32(dhi[0], dhi[1]);
    q_group_out_512(p, _mm512_add_epi32(lo, _mm512_srai_epi32(hi, 4)), _mm512_set1_epi32(p->asum[g]), _mm512_set1_ps(p->sa[g]),
                    (size_t)t * tile_scales + (size_t)g * 16, g, p->y + (size_t)t * 16);
  }
}

/* the same arithmetic as quantize_portable, 16 lanes at a time: max and the products are exact or rounded alike,
   and cvtps rounds half to even as nearbyintf does under the default rounding mode */
VNNI static void quantize_vnni(const float* x, int M, int K, int group, int8_t* qa, float* sa, int32_t* asum) {
  const int G = K / group;
  for (int r = 0; r < M; r++) {
    for (int g = 0; g < G; g++) {
      const float* xs = x + (size_t)r * K + (size_t)g * group;
      __m512 vmax = _mm512_setzero_ps();
      __mmask16 bad = 0;
      for (int i = 0; i < group; i += 16) {
        const __mmask16 m = group - i >= 16 ? 0xFFFF : (__mmask16)((1u << (group - i)) - 1);
        const __m512 a = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, xs + i));
        bad |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(FLT_MAX), _CMP_NLE_UQ); /* inf and NaN */
        vmax = _mm512_max_ps(vmax, a);
      }
      const int finite = bad == 0;
      const float amax = _mm512_reduce_max_ps(vmax); /* exact, whatever the order, when no lane is NaN */
      float inv_s = 127.f / amax;
      if (!finite || !(inv_s <= FLT_MAX)) inv_s = 0.f;
      const __m512 inv = _mm512_set1_ps(inv_s);
      int8_t* q = qa + (size_t)r * K + (size_t)g * group;
      __m512i vsum = _mm512_setzero_si512();
      for (int i = 0; i < group; i += 16) {
        const __mmask16 m = group - i >= 16 ? 0xFFFF : (__mmask16)((1u << (group - i)) - 1);
        const __m512i v = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_maskz_loadu_ps(m, xs + i), inv));
        _mm512_mask_cvtsepi32_storeu_epi8(q + i, m, v);
        vsum = _mm512_add_epi32(vsum, _mm512_maskz_mov_epi32(m, v));
      }
      sa[(size_t)r * G + g] = finite ? amax / 127.f : NAN;
      asum[(size_t)r * G + g] = _mm512_reduce_add_epi32(vsum);
    }
  }
}

/* -- AVX2 (+FMA): CPUs without AVX-512 VNNI ---------------------------------------------------------------------
   maddubs multiplies the unsigned codes by the int8 activations and adds adjacent pairs into int16 (at most
   2 x 15 x 128 each: no saturation), the low and high halves' pairs are added (at most 7680) and summed in int16 over
   runs of 4 blocks (at most 30720: no wrap), and madd with ones sums each run's pairs into int32: the same exact
   integer per column and group as vpdpbusd, so the same bits (q4_kernels.h: q_tile_avx2).
   A pass takes 1-5 rows over both halves of a tile (8 columns each), and 6 rows as 3 and 3. Over both halves a row's
   activations are broadcast once a block, not once a half: the loop is bound by the loads and vector operations of a
   block, and 3-5 rows (a verification of 2-4 drafts) then read the weights 1.2-1.4x as fast on a Zen 3 as in two
   passes of one half each (benchmarks/bench_q4_kernel.c), although 5 rows' sums and the unpacked block take more than
   AVX2's 16 registers (the compiler's spills cost less than the second pass). */
#define AVX2 __attribute__((target("avx2,fma")))

#define AVX2_FN(R, H) \
  AVX2 static void tile_avx2_##R##x##H(const q_problem* p, int h0, int r0, int t) { q_tile_avx2(p, R, H, h0, r0, t, 0); }
AVX2_FN(1, 2) AVX2_FN(2, 2) AVX2_FN(3, 2) AVX2_FN(4, 2) AVX2_FN(5, 2)
/* 6 rows: 3 and 3, both halves (the second pass finds the tile in L2) */
AVX2 static void tile_avx2_6x2(const q_problem* p, int h0, int r0, int t) {
  q_tile_avx2(p, 3, 2, h0, r0, t, 0);
  q_tile_avx2(p, 3, 2, h0, r0 + 3, t, 0);
}
static const q_half_fn avx2_by_rows[7] = {0, tile_avx2_1x2, tile_avx2_2x2, tile_avx2_3x2, tile_avx2_4x2, tile_avx2_5x2, tile_avx2_6x2};

/* quantize_vnni's arithmetic 8 lanes at a time (a group's tail, if its size is not a multiple of 8, as quantize_portable:
   nearbyintf and cvtps round alike), so that a CPU without AVX-512 does not quantize one value at a time */
AVX2 static void quantize_avx2(const float* x, int M, int K, int group, int8_t* qa, float* sa, int32_t* asum) {
  const int G = K / group, V = group & ~7; /* V: the lanes taken 8 at a time */
  const __m256 no_sign = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)), big = _mm256_set1_ps(FLT_MAX);
  for (int r = 0; r < M; r++) {
    for (int g = 0; g < G; g++) {
      const float* xs = x + (size_t)r * K + (size_t)g * group;
      __m256 vmax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
      for (int i = 0; i < V; i += 8) {
        const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xs + i), no_sign);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ)); /* inf and NaN */
        vmax = _mm256_max_ps(vmax, a);
      }
      float lanes[8], amax = 0.f;
      int finite = _mm256_movemask_ps(bad) == 0;
      _mm256_storeu_ps(lanes, vmax);
      for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax; /* exact in any order without NaN */
      for (int i = V; i < group; i++) {
        const float a = fabsf(xs[i]);
        finite &= a <= FLT_MAX;
        amax = a > amax ? a : amax;
      }
      float inv_s = 127.f / amax;
      if (!finite || !(inv_s <= FLT_MAX)) inv_s = 0.f;
      const __m256 inv = _mm256_set1_ps(inv_s);
      int8_t* q = qa + (size_t)r * K + (size_t)g * group;
      __m256i vsum = _mm256_setzero_si256();
      for (int i = 0; i < V; i += 8) {
        const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xs + i), inv));
        const __m128i v16 = _mm_packs_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
        _mm_storel_epi64((__m128i*)(q + i), _mm_packs_epi16(v16, v16));
        vsum = _mm256_add_epi32(vsum, v);
      }
      int32_t sums[8];
      uint32_t sum = 0; /* wrapping as the lanes do (a NaN's code is INT_MIN: its row's outputs are NaN anyway) */
      _mm256_storeu_si256((__m256i*)sums, vsum);
      for (int i = 0; i < 8; i++) sum += (uint32_t)sums[i];
      for (int i = V; i < group; i++) {
        const int v = (int)nearbyintf(xs[i] * inv_s);
        q[i] = (int8_t)v;
        sum += (uint32_t)v;
      }
      sa[(size_t)r * G + g] = finite ? amax / 127.f : NAN;
      asum[(size_t)r * G + g] = (int32_t)sum;
    }
  }
}

static int cpu_has(int vnni) {
  __builtin_cpu_init();
  if (vnni) return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

/* the fastest kernel this CPU runs; $SPECDEC_Q4_KERNEL = portable | avx2 | vnni picks a slower one (tests: every
   kernel on one machine; a faster one than the CPU has is not taken) */
int q_kernel(void) {
  static int chosen = -1; /* decided once; threads racing to decide store the same value */
  int k = __atomic_load_n(&chosen, __ATOMIC_RELAXED);
  if (k < 0) {
    k = KERNEL_PORTABLE;
#if defined(__x86_64__)
    k = cpu_has(1) ? KERNEL_VNNI : cpu_has(0) ? KERNEL_AVX2 : KERNEL_PORTABLE;
#endif
    const char* want = getenv("SPECDEC_Q4_KERNEL");
    if (want && strcmp(want, "portable") == 0) k = KERNEL_PORTABLE;
    if (want && strcmp(want, "avx2") == 0 && k > KERNEL_AVX2) k = KERNEL_AVX2;
    __atomic_store_n(&chosen, k, __ATOMIC_RELAXED);
  }
  return k;
}

const char* q4_kernel_name(void) {
  static const char* names[] = {"portable C", "AVX2", "AVX-512 VNNI"};
  return names[q_kernel()];
}

void q4_quantize_rows(const float* x, int M, int K, int group, int8_t* qa, float* sa, int32_t* asum) {
#if defined(__x86_64__)
  if (q_kernel() == KERNEL_VNNI) {
    quantize_vnni(x, M, K, group, qa, sa, asum);
    return;
  }
  if (q_kernel() == KERNEL_AVX2) {
    quantize_avx2(x, M, K, group, qa, sa, asum);
    return;
  }
#endif
  quantize_portable(x, M, K, group, qa, sa, asum);
}

void q4_gemm_tiles(const q_problem* p, int t_begin, int t_end) {
#if defined(__x86_64__)
  if (q_kernel() == KERNEL_VNNI) {
    if (p->stream && p->M == 1)
      for (int t = t_begin; t < t_end; t++) stream_1row(p, t);
    else q_vnni_passes(p, t_begin, t_end, tiles_by_rows);
    return;
  }
  if (q_kernel() == KERNEL_AVX2) {
    q_avx2_passes(p, t_begin, t_end, avx2_by_rows, 6);
    return;
  }
#endif
  gemm_portable(p, t_begin, t_end);
}
