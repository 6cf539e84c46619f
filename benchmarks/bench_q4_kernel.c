/* The int4 GEMM kernel alone (q4_gemm_tiles) against plain reads of the same bytes: is a step at one thread memory-
 * or compute-bound, and how fast can its weights be read at all? (issue 41)
 *
 *   cc -O3 -march=native -I hardware/kernels -o /tmp/bench_q4_kernel benchmarks/bench_q4_kernel.c -ldl
 *   cc -O3 -ffp-contract=off -fno-fast-math -fPIC -shared -o /tmp/q4.so hardware/kernels/q4_kernels.c hardware/kernels/q8_kernels.c -lm
 *   /tmp/bench_q4_kernel [--memory anon|huge|FILE] [--rounds N] [--rows 1,5] LIB[:stream] [LIB[:stream] ...]
 *
 * The weights are those of a 25-layer model of hidden size 2048 and MLP 8192 (the enlarged 1.5B target's shapes:
 * q|k|v 2048x3072, o 2048x2048, gate|up 2048x16384 (swiglu's halves in turn), down 8192x2048; 808 MB, group 128),
 * held in --memory: anon (malloc's 4 KiB pages), huge (2 MiB pages, what ort_q4gemm.c's copy gets) or FILE (carved in
 * order from a mapping of FILE, e.g. an engine's model.onnx.data: the 4 KiB page-cache pages ONNX Runtime reads).
 * anon and huge get random codes and scales of 1e-3 (a FILE's scales are whatever bytes lie there).
 * Each LIB is a build of the kernel sources (above); ":stream" sets q_problem.stream (the one-stream passes of weights
 * in huge pages). Every case runs over every layer each round, the cases taking turns layer by layer on different
 * layers (none finds another's bytes in the cache), so that a shared machine's drifting bandwidth falls on all alike:
 *   read             the layer's bytes summed with 8 AVX-512 loads a step (AVX2: 16 of 32 bytes), as stream_read.c
 *   read+prefetch    the same with a software prefetch 4 KiB ahead (across the next page boundary)
 *   LIB, R rows      (R: each of --rows, at most 8) one op call per matrix as ort_q4gemm.c makes it at one thread: quantize
 *                    R rows, then blocks of 4
 *                    column tiles
 * and, apart, each LIB and row count on a 256-column matrix that stays in L2 (taking turns each round): the kernel's
 * compute ceiling.
 * Prints the median [min-max] GB/s (thread CPU time: a descheduled thread does not count) and each case over the read
 * of the same round (the paired ratio, the steadiest figure on a shared machine). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "q4_kernels.h"

typedef void (*tiles_fn)(const q_problem*, int, int);
typedef void (*quant_fn)(const float*, int, int, int, int8_t*, float*, int32_t*);
typedef struct { tiles_fn tiles; quant_fn quant; int stream; const char* name; } Lib;
typedef struct { int K, N, swiglu; const uint8_t* w; const float* sw; } Mat;

enum { HIDDEN = 2048, INTER = 8192, GROUP = 128, LAYERS = 25, MAX_ROWS = 8, MAX_LIBS = 8, HUGE_PAGE = 2 << 20 };
static int ROWS[MAX_ROWS] = {1, 5}, row_counts = 2;
static int32_t zero = 8;
static float x[MAX_ROWS * INTER], y[MAX_ROWS * 2 * INTER];
static int8_t qa[MAX_ROWS * INTER];
static float sa[MAX_ROWS * INTER / GROUP];
static int32_t asum[MAX_ROWS * INTER / GROUP];

static double cpu_now(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static size_t weight_bytes(int K, int N) { return (size_t)K * N / 2; }
static size_t scale_bytes(int K, int N) { return (size_t)K / GROUP * N * 4; }
static size_t mat_bytes(const Mat* m) { return weight_bytes(m->K, m->N) + scale_bytes(m->K, m->N); }

/* all matrices' bytes, one after another, in the memory asked for */
static uint8_t* weights_memory(const char* memory, size_t total) {
  if (strcmp(memory, "anon") == 0) {
    uint8_t* p = aligned_alloc(64, total);
    for (size_t i = 0; p && i < total; i++) p[i] = (uint8_t)(i * 2654435761u >> 13);
    return p;
  }
  if (strcmp(memory, "huge") == 0) {
    uint8_t* m = mmap(NULL, total + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return NULL;
    uint8_t* p = (uint8_t*)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    madvise(p, total, MADV_HUGEPAGE);
    for (size_t i = 0; i < total; i++) p[i] = (uint8_t)(i * 2654435761u >> 13);
    return p;
  }
  const int fd = open(memory, O_RDONLY);
  struct stat st;
  if (fd < 0 || fstat(fd, &st) || (size_t)st.st_size < total) {
    fprintf(stderr, "%s: cannot be read, or is smaller than the %zu bytes of weights\n", memory, total);
    return NULL;
  }
  uint8_t* p = mmap(NULL, total, PROT_READ, MAP_PRIVATE, fd, 0);
  if (p == MAP_FAILED) return NULL;
  volatile uint8_t s = 0;
  for (size_t i = 0; i < total; i += 4096) s += p[i]; /* in the page cache before the first round */
  return p; /* (a file's scales are whatever bytes lie there: the arithmetic's speed does not depend on them) */
}

/* one op call as ort_q4gemm.c makes it at one thread: quantize, then blocks of 4 tiles (swiglu: gate's, then up's) */
static void run_mat(const Lib* lib, const Mat* m, int M) {
  lib->quant(x, M, m->K, GROUP, qa, sa, asum);
  const int G = m->K / GROUP, half = m->swiglu ? m->N / 2 : m->N;
  q_problem p = {M, m->K, half, GROUP, qa, sa, asum, m->w, m->sw, &zero, 1, y, lib->stream};
  q_problem up = p;
  up.w += (size_t)(half / 16) * m->K * 8;
  up.sw += (size_t)(half / 16) * G * 16;
  up.y = y + (size_t)M * half;
  for (int t = 0; t < half / 16; t += 4) {
    const int e = t + 4 < half / 16 ? t + 4 : half / 16;
    lib->tiles(&p, t, e);
    if (m->swiglu) lib->tiles(&up, t, e);
  }
}

/* n bytes summed with 8 independent AVX-512 loads a step; prefetch > 0: also a prefetch that far ahead */
__attribute__((target("avx512f"), noinline)) static uint64_t read_bytes_512(const uint8_t* b, size_t n, size_t prefetch) {
  __m512i s[8];
  for (int i = 0; i < 8; i++) s[i] = _mm512_setzero_si512();
  for (size_t i = 0; i + 512 <= n; i += 512) {
    if (prefetch)
      for (int j = 0; j < 8; j++) _mm_prefetch((const char*)b + i + prefetch + 64 * j, _MM_HINT_T1);
    for (int j = 0; j < 8; j++) s[j] = _mm512_add_epi64(s[j], _mm512_loadu_si512(b + i + 64 * j));
  }
  for (int i = 1; i < 8; i++) s[0] = _mm512_add_epi64(s[0], s[i]);
  return (uint64_t)_mm512_reduce_add_epi64(s[0]);
}

/* the same with AVX2's 32-byte loads (16 a step), on a CPU without AVX-512 */
__attribute__((target("avx2"), noinline)) static uint64_t read_bytes_256(const uint8_t* b, size_t n, size_t prefetch) {
  __m256i s[8];
  for (int i = 0; i < 8; i++) s[i] = _mm256_setzero_si256();
  for (size_t i = 0; i + 512 <= n; i += 512) {
    if (prefetch)
      for (int j = 0; j < 8; j++) _mm_prefetch((const char*)b + i + prefetch + 64 * j, _MM_HINT_T1);
    for (int j = 0; j < 16; j++) s[j & 7] = _mm256_add_epi64(s[j & 7], _mm256_loadu_si256((const __m256i*)(b + i + 32 * j)));
  }
  for (int i = 1; i < 8; i++) s[0] = _mm256_add_epi64(s[0], s[i]);
  uint64_t lanes[4];
  _mm256_storeu_si256((__m256i*)lanes, s[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

static uint64_t read_bytes(const uint8_t* b, size_t n, size_t prefetch) {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") ? read_bytes_512(b, n, prefetch) : read_bytes_256(b, n, prefetch);
}

static int by_value(const void* a, const void* b) { double u = *(const double*)a, v = *(const double*)b; return (u > v) - (u < v); }

/* median [min-max] of v[0..n) (sorted in place) */
static void spread(double* v, int n, double* med, double* lo, double* hi) {
  qsort(v, n, sizeof(double), by_value);
  *med = v[n / 2], *lo = v[0], *hi = v[n - 1];
}

int main(int argc, char** argv) {
  const char* memory = "anon";
  int rounds = 7, libs = 0;
  Lib lib[MAX_LIBS];
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--memory") == 0 && i + 1 < argc) memory = argv[++i];
    else if (strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) rounds = atoi(argv[++i]);
    else if (strcmp(argv[i], "--rows") == 0 && i + 1 < argc) {
      row_counts = 0;
      for (char* tok = strtok(argv[++i], ","); tok && row_counts < MAX_ROWS; tok = strtok(NULL, ",")) {
        const int r = atoi(tok);
        if (r < 1 || r > MAX_ROWS) { fprintf(stderr, "--rows: 1 to %d rows\n", MAX_ROWS); return 2; }
        ROWS[row_counts++] = r;
      }
    }
    else if (libs < MAX_LIBS && argv[i][0] != '-') {
      char* path = strdup(argv[i]);
      char* colon = strrchr(path, ':');
      lib[libs].stream = colon && strcmp(colon, ":stream") == 0;
      if (lib[libs].stream) *colon = 0;
      void* h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      lib[libs].tiles = h ? (tiles_fn)dlsym(h, "q4_gemm_tiles") : NULL;
      lib[libs].quant = h ? (quant_fn)dlsym(h, "q4_quantize_rows") : NULL;
      lib[libs].name = argv[i];
      if (!lib[libs].tiles || !lib[libs].quant) {
        fprintf(stderr, "%s: %s\n", path, h ? "exports no q4_gemm_tiles / q4_quantize_rows (build it as above)" : dlerror());
        return 1;
      }
      libs++;
    } else {
      fprintf(stderr, "usage: bench_q4_kernel [--memory anon|huge|FILE] [--rounds N] LIB[:stream] ... (at most %d)\n", MAX_LIBS);
      return 2;
    }
  }
  if (libs == 0 || rounds < 1) {
    fprintf(stderr, "usage: bench_q4_kernel [--memory anon|huge|FILE] [--rounds N] LIB[:stream] ...\n");
    return 2;
  }
  for (int i = 0; i < MAX_ROWS * INTER; i++) x[i] = (float)((i * 7919) % 255 - 127) / 64.f;
  static const int shapes[4][3] = {{HIDDEN, 3072, 0}, {HIDDEN, HIDDEN, 0}, {HIDDEN, 2 * INTER, 1}, {INTER, HIDDEN, 0}};
  Mat mats[4 * LAYERS];
  size_t total = 0;
  for (int i = 0; i < 4 * LAYERS; i++) total += weight_bytes(shapes[i % 4][0], shapes[i % 4][1]) + scale_bytes(shapes[i % 4][0], shapes[i % 4][1]);
  uint8_t* bytes = weights_memory(memory, total);
  if (!bytes) return 1;
  size_t off = 0;
  for (int i = 0; i < 4 * LAYERS; i++) {
    const int K = shapes[i % 4][0], N = shapes[i % 4][1];
    mats[i] = (Mat){K, N, shapes[i % 4][2], bytes + off, (const float*)(bytes + off + weight_bytes(K, N))};
    if (strcmp(memory, "anon") == 0 || strcmp(memory, "huge") == 0) /* scales of a real size: random bytes read as floats
      include subnormals, which cost an Intel core a microcode assist in every group's epilogue (an AMD core's cost for
      them was not measured; the logs before this fix were taken with random scales) */
      for (size_t j = 0; j < scale_bytes(K, N) / 4; j++) ((float*)(bytes + off + weight_bytes(K, N)))[j] = 1e-3f;
    off += mat_bytes(&mats[i]);
  }
  printf("%.0f MB of int4 weights in %d matrices, memory: %s; %d rounds\n", total / 1e6, 4 * LAYERS, memory, rounds);

  /* the streaming cases, layer by layer in turns: 0 read, 1 read+prefetch, then each library x ROWS[0..row_counts) */
  const int cases = 2 + row_counts * libs;
  double* secs = calloc((size_t)cases * rounds, sizeof(double));
  volatile uint64_t sink = 0;
  const int stride = LAYERS / cases > 0 ? LAYERS / cases : 1;
  for (int r = -1; r < rounds; r++) /* round -1 warms up */
    for (int i = 0; i < LAYERS; i++)
      for (int k = 0; k < cases; k++) {
        const int layer = (i + k * stride) % LAYERS;
        const double t0 = cpu_now();
        for (int j = 0; j < 4; j++) {
          const Mat* m = &mats[4 * layer + j];
          if (k < 2) sink += read_bytes(m->w, mat_bytes(m), k ? 4096 : 0); /* w and its scales lie together */
          else run_mat(&lib[(k - 2) / row_counts], m, ROWS[(k - 2) % row_counts]);
        }
        if (r >= 0) secs[(size_t)k * rounds + r] += cpu_now() - t0;
      }
  double* v = malloc(sizeof(double) * rounds);
  for (int k = 0; k < cases; k++) {
    double med, lo, hi, rmed, rlo, rhi;
    for (int r = 0; r < rounds; r++) v[r] = total / secs[(size_t)k * rounds + r] / 1e9;
    spread(v, rounds, &med, &lo, &hi);
    for (int r = 0; r < rounds; r++) v[r] = secs[r] / secs[(size_t)k * rounds + r];
    spread(v, rounds, &rmed, &rlo, &rhi);
    char label[600];
    if (k < 2) snprintf(label, sizeof label, "%s", k ? "read+prefetch 4 KiB ahead" : "read");
    else snprintf(label, sizeof label, "%s, %d row(s)", lib[(k - 2) / row_counts].name, ROWS[(k - 2) % row_counts]);
    printf("%-56s %6.1f GB/s [%5.1f-%5.1f] %5.0f%% of read [%3.0f-%3.0f]\n", label, med, lo, hi, 100 * rmed, 100 * rlo, 100 * rhi);
  }

  /* the compute ceiling: a 256-column matrix that stays in L2, as many bytes as the weights a round */
  const int K = HIDDEN, N = 256;
  uint8_t* small = aligned_alloc(64, weight_bytes(K, N) + scale_bytes(K, N));
  for (size_t i = 0; i < weight_bytes(K, N) + scale_bytes(K, N); i++) small[i] = (uint8_t)(i * 2654435761u >> 13);
  for (size_t i = 0; i < scale_bytes(K, N) / 4; i++) ((float*)(small + weight_bytes(K, N)))[i] = 1e-3f;
  const Mat m = {K, N, 0, small, (const float*)(small + weight_bytes(K, N))};
  const int reps = (int)(total / mat_bytes(&m) / 8);
  double* gbs = malloc(sizeof(double) * libs * row_counts * rounds); /* [lib][rows][round]: the cases take turns each round */
  for (int r = 0; r < rounds; r++)
    for (int l = 0; l < libs; l++)
      for (int ri = 0; ri < row_counts; ri++) {
        const double t0 = cpu_now();
        for (int i = 0; i < reps; i++) run_mat(&lib[l], &m, ROWS[ri]);
        gbs[((size_t)l * row_counts + ri) * rounds + r] = reps * mat_bytes(&m) / (cpu_now() - t0) / 1e9;
      }
  for (int l = 0; l < libs; l++)
    for (int ri = 0; ri < row_counts; ri++) {
      double med, lo, hi;
      spread(gbs + ((size_t)l * row_counts + ri) * rounds, rounds, &med, &lo, &hi);
      char label[600];
      snprintf(label, sizeof label, "%s, %d row(s), in L2", lib[l].name, ROWS[ri]);
      printf("%-56s %6.1f GB/s [%5.1f-%5.1f]\n", label, med, lo, hi);
    }
  return (int)(sink & 0);
}
