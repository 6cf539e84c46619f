/* The MLP's gate in the GEMM that makes it: y = silu(gate) * up = gate / (1 + exp(-gate)) * up, so the gate|up
 * projection writes the MLP's hidden row at once (no Split, Sigmoid and Mul nodes, no gate and up tensors).
 *
 * exp is Cephes' expf (range reduction by ln 2 in two parts, a degree-5 polynomial, the exponent put in by bits:
 * within 2 ulp of the true value) written as the same sequence of IEEE float operations in the portable and AVX2
 * code: both give the same bits (compiled with -ffp-contract=off, so no operation is fused), and a
 * row's bits never depend on the rows beside it. The input is clamped to [-87, 88] first, where 2^n stays a normal
 * float: exp(-gate) past that only decides whether silu is 0 or gate, which the clamp keeps (and NaN stays NaN). */
#include <math.h>

#include "q4_kernels.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define EXP_HI 88.0f
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

/* the lane arithmetic, in the order every kernel does it; max(a, b) and min(a, b) as the x86 instructions define
   them (the second operand when either is NaN), so a NaN gate is clamped alike everywhere (its row is NaN anyway) */
static float swiglu_one(float g, float u) {
  float x = -g;
  x = x > EXP_LO ? x : EXP_LO;
  x = x < EXP_HI ? x : EXP_HI;
  const float n = nearbyintf(x * LOG2E); /* round half to even: the default rounding mode */
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
  union { int32_t i; float f; } pow2 = {.i = ((int32_t)n + 127) << 23};
  e = e * pow2.f;
  return g / (1.f + e) * u;
}

static void rows_portable(const float* gate, const float* up, float* y, int M, int ld, int c_begin, int c_end) {
  for (int r = 0; r < M; r++)
    for (int c = c_begin; c < c_end; c++) y[(size_t)r * ld + c] = swiglu_one(gate[(size_t)r * ld + c], up[(size_t)r * ld + c]);
}

#if defined(__x86_64__)
/* One 8-lane vector kernel for every x86 CPU with AVX2, AVX-512 ones included: a 16-lane copy of the same lines gave the
   same bits and no measurable gain (this is a few microseconds of a step whose weights take tens of milliseconds). */
__attribute__((target("avx2,fma"))) static void rows_avx2(const float* gate, const float* up, float* y, int M, int ld, int c_begin, int c_end) {
  for (int r = 0; r < M; r++) {
    int c = c_begin;
    for (; c + 8 <= c_end; c += 8) {
      const size_t i = (size_t)r * ld + c;
      const __m256 g = _mm256_loadu_ps(gate + i);
      __m256 x = _mm256_xor_ps(g, _mm256_set1_ps(-0.f)); /* -g */
      x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
      x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
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
      e = _mm256_mul_ps(e, _mm256_castsi256_ps(pow2));
      const __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
      _mm256_storeu_ps(y + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; c < c_end; c++) y[(size_t)r * ld + c] = swiglu_one(gate[(size_t)r * ld + c], up[(size_t)r * ld + c]);
  }
}
#endif

void swiglu_rows(const float* gate, const float* up, float* y, int M, int ld, int c_begin, int c_end) {
#if defined(__x86_64__)
  if (q_kernel() != KERNEL_PORTABLE) {
    rows_avx2(gate, up, y, M, ld, c_begin, c_end);
    return;
  }
#endif
  rows_portable(gate, up, y, M, ld, c_begin, c_end);
}
