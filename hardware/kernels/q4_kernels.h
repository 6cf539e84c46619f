/* int4 x int8 GEMM for specdec's CPU engines: the kernels behind the ai.specdec.cpu Q4Gemm op.
 *
 * y[m, n] = sum over groups g of  sa[m, g] * sw[n, g] * (sum over k in g of (w[k, n] - z[n, g]) * qa[m, k])
 *
 * qa: the activations as int8, per row and group (scale sa = amax / 127), so the inner sums are exact integers
 * and only the per-group float terms round. Every row takes the same instructions in the same order whatever
 * the row count, its position in the call and the thread that runs its columns: a row's bits never depend on
 * the call's shape. That is what lets a one-token step and a (k + 1)-token verification give identical logits
 * without padding (docs/precision.md). The AVX-512 VNNI kernel and the portable one compute the same bits.
 *
 * Weight layout: [N / 16 column tiles][G groups][group / 8 quads-pairs][64 bytes]; byte (c * 4 + j) of a
 * 64-byte block holds, for column c of the tile, k = 8p + j in its low nibble and k = 8p + 4 + j in its high
 * one. Scales sw and zero points z: [N / 16][G][16] (float32, int32).
 */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int M, K, N, group;
  const int8_t* qa;    /* [M, K] */
  const float* sa;     /* [M, G] */
  const int32_t* asum; /* [M, G]: sum of each group's codes (the zero point's share) */
  const uint8_t* w;
  const float* sw;
  const int32_t* zw;
  float* y;            /* [M, N] */
} q4_problem;

void q4_quantize_rows(const float* x, int M, int K, int group, int8_t* qa, float* sa, int32_t* asum);
/* columns [16 * t_begin, 16 * t_end) of every row */
void q4_gemm_tiles(const q4_problem* p, int t_begin, int t_end);
/* which kernel runs here: "AVX-512 VNNI", "AVX2" or "portable C" */
const char* q4_kernel_name(void);
