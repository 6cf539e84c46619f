/* Cephes' expf, the one exp of specdec's CPU kernels (swiglu.c's sigmoid, CachedAttention's softmax): range reduction
 * by ln 2 in two parts, a degree-5 polynomial, the exponent put in by bits (within 2 ulp of the true value). One
 * sequence of IEEE float operations for the scalar and the 8-lane AVX2 form (attention_avx512.c writes the 16-lane one
 * alike), so every kernel's exp gives the same bits (-ffp-contract=off keeps each operation unfused). The input must be
 * clamped to [EXP_LO, EXP_HI] already, where 2^n stays a normal float: each caller clamps its own way (silu clamps a NaN
 * gate, whose row is NaN anyway; the softmax keeps NaN). */
#pragma once
#include <math.h>
#include <stdint.h>

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

static inline float exp_cephes(float x) {
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
  union { int32_t i; float f; } pow2 = {.i = ((n == n ? (int32_t)n : 0) + 127) << 23}; /* NaN: e is NaN already */
  return e * pow2.f;
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2,fma"))) static inline __m256 exp_cephes_256(__m256 x) {
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
  return _mm256_mul_ps(e, _mm256_castsi256_ps(pow2));
}
#endif
