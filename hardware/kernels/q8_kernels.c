/* int8 weights (see q4_kernels.h): the int4 kernels' passes and arithmetic, 4 codes a byte quad instead of 8 a
 * nibble pair. Each code times its int8 activation sums exactly into int32 (a group of at most 65536 rows: 65536 x
 * 255 x 127 < 2^31), the zero point's share comes off once per group, and a group's term goes into the output row
 * in group order: the same float operations as the int4 kernels, so every row's bits are the same in any call and
 * on every kernel. Compiled with the flags of q4_kernels.c. */
#include <math.h>
#include <string.h>

#include "q4_kernels.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static void gemm8_portable(const q_problem* p, int t_begin, int t_end) {
  const int G = p->K / p->group, Q = p->group / 4;
  for (int t = t_begin; t < t_end; t++)
    for (int r = 0; r < p->M; r++)
      for (int c = 0; c < 16; c++) {
        float acc = 0.f;
        for (int g = 0; g < G; g++) {
          int32_t dot = 0;
          const uint8_t* wb = p->w + (((size_t)t * G + g) * Q) * 64;
          const int8_t* a = p->qa + (size_t)r * p->K + (size_t)g * p->group;
          for (int q = 0; q < Q; q++)
            for (int j = 0; j < 4; j++) dot += (int32_t)wb[q * 64 + c * 4 + j] * a[q * 4 + j];
          const size_t s = ((size_t)t * G + g) * 16 + c;
          acc = q_group_term(p, dot, (size_t)r * G + g, s, acc);
        }
        p->y[(size_t)r * p->N + (size_t)t * 16 + c] = acc;
      }
}

#if defined(__x86_64__)
#define VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define AVX2 __attribute__((target("avx2,fma")))

/* R rows x CT tiles a pass, one vpdpbusd per row and 64-byte block; the next tiles' blocks prefetched into L2 */
VNNI __attribute__((always_inline)) static inline void tile8_vnni(const q_problem* p, const int R, const int CT, int r0, int t) {
  const int G = p->K / p->group, Q = p->group / 4, tiles = p->N / 16;
  const size_t tile_bytes = (size_t)G * Q * 64, tile_scales = (size_t)G * 16;
  const uint8_t* w0 = p->w + (size_t)t * tile_bytes;
  for (int g = 0; g < G; g++) {
    __m512i dot[8][4];
    for (int r = 0; r < R; r++)
      for (int c = 0; c < CT; c++) dot[r][c] = _mm512_setzero_si512();
    const int8_t* a = p->qa + (size_t)r0 * p->K + (size_t)g * p->group;
    const uint8_t* wg = w0 + (size_t)g * Q * 64;
    for (int q = 0; q < Q; q++) {
      __m512i b[4];
      for (int c = 0; c < CT; c++) {
        const uint8_t* src = wg + (size_t)c * tile_bytes + (size_t)q * 64;
        if (t + c + CT < tiles) _mm_prefetch((const char*)src + CT * tile_bytes, _MM_HINT_T1);
        b[c] = _mm512_loadu_si512(src);
      }
      for (int r = 0; r < R; r++) {
        int32_t a4;
        memcpy(&a4, a + (size_t)r * p->K + q * 4, 4);
        const __m512i x = _mm512_set1_epi32(a4);
        for (int c = 0; c < CT; c++) dot[r][c] = _mm512_dpbusd_epi32(dot[r][c], b[c], x);
      }
    }
    for (int r = 0; r < R; r++) {
      const __m512i as = _mm512_set1_epi32(p->asum[(size_t)(r0 + r) * G + g]);
      const __m512 ss = _mm512_set1_ps(p->sa[(size_t)(r0 + r) * G + g]);
      for (int c = 0; c < CT; c++) {
        const size_t s = (size_t)(t + c) * tile_scales + (size_t)g * 16;
        float* y = p->y + (size_t)(r0 + r) * p->N + (size_t)(t + c) * 16;
        q_group_out_512(p, dot[r][c], as, ss, s, g, y);
      }
    }
  }
}

#define TILE8_FN(R, CT) \
  VNNI static void tile8_##R##x##CT(const q_problem* p, int r0, int t) { tile8_vnni(p, R, CT, r0, t); }
TILE8_FN(1, 4) TILE8_FN(2, 4) TILE8_FN(3, 4) TILE8_FN(4, 4) TILE8_FN(5, 2) TILE8_FN(6, 2) TILE8_FN(7, 2) TILE8_FN(8, 2)
TILE8_FN(1, 2) TILE8_FN(2, 2) TILE8_FN(3, 2) TILE8_FN(4, 2)
TILE8_FN(1, 1) TILE8_FN(2, 1) TILE8_FN(3, 1) TILE8_FN(4, 1) TILE8_FN(5, 1) TILE8_FN(6, 1) TILE8_FN(7, 1) TILE8_FN(8, 1)
/* [rows][4, 2, 1 column tiles] */
static const q_tile_fn tiles8_by_rows[9][3] = {{0},
    {tile8_1x4, tile8_1x2, tile8_1x1}, {tile8_2x4, tile8_2x2, tile8_2x1}, {tile8_3x4, tile8_3x2, tile8_3x1}, {tile8_4x4, tile8_4x2, tile8_4x1},
    {0, tile8_5x2, tile8_5x1}, {0, tile8_6x2, tile8_6x1}, {0, tile8_7x2, tile8_7x1}, {0, tile8_8x2, tile8_8x1}};

/* AVX2: maddubs of an unsigned code by a signed activation saturates int16 past 2 x 255 x 127, so each code goes in
   as its two nibbles (pairs of at most 2 x 15 x 128): sum(lo * a) + 16 x sum(hi * a), the same exact integer as
   vpdpbusd's. R rows x H halves (8 columns each) of a tile a pass, as the int4 AVX2 kernel. */
#define AVX2_8_FN(R, H) \
  AVX2 static void tile8_avx2_##R##x##H(const q_problem* p, int h0, int r0, int t) { q_tile_avx2(p, R, H, h0, r0, t, 1); }
AVX2_8_FN(1, 2) AVX2_8_FN(2, 2) AVX2_8_FN(3, 1) AVX2_8_FN(4, 1) AVX2_8_FN(5, 1) AVX2_8_FN(6, 1)
static const q_half_fn avx2_8_by_rows[7] = {0, tile8_avx2_1x2, tile8_avx2_2x2, tile8_avx2_3x1, tile8_avx2_4x1, tile8_avx2_5x1,
                                            tile8_avx2_6x1};
#endif

void q8_gemm_tiles(const q_problem* p, int t_begin, int t_end) {
#if defined(__x86_64__)
  if (q_kernel() == KERNEL_VNNI) {
    q_vnni_passes(p, t_begin, t_end, tiles8_by_rows);
    return;
  }
  if (q_kernel() == KERNEL_AVX2) {
    q_avx2_passes(p, t_begin, t_end, avx2_8_by_rows, 2);
    return;
  }
#endif
  gemm8_portable(p, t_begin, t_end);
}
