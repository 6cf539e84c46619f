/* The MLP's gate in the GEMM that makes it: y = silu(gate) * up = gate / (1 + exp(-gate)) * up, so the gate|up
 * projection writes the MLP's hidden row at once (no Split, Sigmoid and Mul nodes, no gate and up tensors); and the
 * ai.specdec.cpu::SwiGLU op (ort_swiglu.c) that computes it in one node after a gate|up MatMul or MatMulNBits.
 *
 * exp is Cephes' expf (range reduction by ln 2 in two parts, a degree-5 polynomial, the exponent put in by bits:
 * within 2 ulp of the true value) written as the same sequence of IEEE float operations in the portable and AVX2
 * code: both give the same bits (compiled with -ffp-contract=off, so no operation is fused), and a
 * row's bits never depend on the rows beside it. The input is clamped to [-87, 88] first, where 2^n stays a normal
 * float: exp(-gate) past that only decides whether silu is 0 or gate, which the clamp keeps (and NaN stays NaN). */
#include <math.h>

#include "exp_cephes.h"
#include "q4_kernels.h"
#if defined(__x86_64__)
#include <immintrin.h>
#endif


/* the lane arithmetic, in the order every kernel does it; max(a, b) and min(a, b) as the x86 instructions define
   them (the second operand when either is NaN), so a NaN gate is clamped alike everywhere (its row is NaN anyway) */
static float swiglu_one(float g, float u) {
  float x = -g;
  x = x > EXP_LO ? x : EXP_LO;
  x = x < EXP_HI ? x : EXP_HI;
  const float e = exp_cephes(x);
  return g / (1.f + e) * u;
}

static void rows_portable(const float* gate, const float* up, int ld_in, float* y, int ld, int M, int c_begin, int c_end) {
  for (int r = 0; r < M; r++)
    for (int c = c_begin; c < c_end; c++) y[(size_t)r * ld + c] = swiglu_one(gate[(size_t)r * ld_in + c], up[(size_t)r * ld_in + c]);
}

#if defined(__x86_64__)
/* One 8-lane vector kernel for every x86 CPU with AVX2, AVX-512 ones included: a 16-lane copy of the same lines gave the
   same bits and no measurable gain (this is a few microseconds of a step whose weights take tens of milliseconds). */
__attribute__((target("avx2,fma"))) static void rows_avx2(const float* gate, const float* up, int ld_in, float* y, int ld, int M, int c_begin,
                                                           int c_end) {
  for (int r = 0; r < M; r++) {
    int c = c_begin;
    for (; c + 8 <= c_end; c += 8) {
      const size_t i = (size_t)r * ld_in + c;
      const __m256 g = _mm256_loadu_ps(gate + i);
      __m256 x = _mm256_xor_ps(g, _mm256_set1_ps(-0.f)); /* -g */
      x = _mm256_max_ps(x, _mm256_set1_ps(EXP_LO));
      x = _mm256_min_ps(x, _mm256_set1_ps(EXP_HI));
      const __m256 e = exp_cephes_256(x);
      const __m256 s = _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.f), e));
      _mm256_storeu_ps(y + (size_t)r * ld + c, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    for (; c < c_end; c++) y[(size_t)r * ld + c] = swiglu_one(gate[(size_t)r * ld_in + c], up[(size_t)r * ld_in + c]);
  }
}
#endif

void swiglu_rows(const float* gate, const float* up, int ld_in, float* y, int ld, int M, int c_begin, int c_end) {
#if defined(__x86_64__)
  if (q_kernel() != KERNEL_PORTABLE) {
    rows_avx2(gate, up, ld_in, y, ld, M, c_begin, c_end);
    return;
  }
#endif
  rows_portable(gate, up, ld_in, y, ld, M, c_begin, c_end);
}
