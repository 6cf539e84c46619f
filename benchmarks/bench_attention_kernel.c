/* CachedAttention's kernel alone (attention_task: no ONNX Runtime, no Python), one thread, its data in cache: builds of
 * hardware/kernels' attention sources against each other, and whether they compute the same bits (issue 41: what a
 * verification step's attention costs, kernel by kernel).
 *
 *   cc -O3 -I hardware/kernels -o /tmp/bench_attention_kernel benchmarks/bench_attention_kernel.c -ldl -lm
 *   (cd hardware/kernels && cc -O3 -ffp-contract=off -fno-fast-math -fPIC -shared -std=c11 -D_GNU_SOURCE \
 *       -o /tmp/attention.so attention.c attention_avx2.c attention_avx512.c q4_kernels.c -lm)
 *   /tmp/bench_attention_kernel [--rounds N] [--reps R] [--shapes H/KV/HD/CTX,...] [--tokens 1,5,9] LIB [LIB ...]
 *
 * A case is a shape (query heads / KV heads / head dim / context) and a token count T: batch 1, the T tokens at
 * positions CTX .. CTX + T - 1 of a cache of CTX + T slots, split into tasks as the op splits them
 * (attention.h's attention_kv_per_task), run one after another. Each round, every LIB (in an order
 * that turns round by round) runs every case REPS times; a round's figure is its fastest call (the machine's other
 * work only ever adds time). Printed per case: each LIB's median [min-max] microseconds over rounds, and each LIB
 * over the first in the same round (the paired ratio, the steadiest figure on a shared machine); and whether every
 * LIB's outputs are the same bits as the first's (under the one kernel this process runs: to set the AVX2 kernel
 * against the portable one, run it once with each). $SPECDEC_Q4_KERNEL = portable | avx2 picks a slower kernel (it
 * chooses the attention kernel too). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "attention.h"

typedef void (*task_fn)(const attn_problem*, size_t);
typedef const char* (*name_fn)(void);
enum { MAX_LIBS = 8, MAX_CASES = 64, MAX_ROUNDS = 101 };

typedef struct { int heads, kv, hd, ctx, tokens; } Case;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static float frand(void) { return (float)rand() / (float)RAND_MAX - 0.5f; }

static int cmp_double(const void* a, const void* b) {
  const double x = *(const double*)a, y = *(const double*)b;
  return x < y ? -1 : x > y;
}

static double median(double* v, int n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One case's buffers, and its problem as the op would pose it */
typedef struct {
  attn_problem p;
  size_t tasks, out_floats;
} Problem;

static Problem make_problem(const Case* c) {
  const int S = c->tokens, cap = c->ctx + S, per = attention_kv_per_task(c->kv, c->hd);
  const size_t qf = (size_t)S * c->heads * c->hd, kvf = (size_t)cap * c->kv * c->hd, tasks = (size_t)(c->kv / per);
  float *q = malloc(qf * sizeof(float)), *k = malloc(kvf * sizeof(float)), *v = malloc(kvf * sizeof(float));
  float* out = malloc(qf * sizeof(float));
  int64_t* pos = malloc(S * sizeof(int64_t));
  int32_t* seen = malloc(S * sizeof(int32_t)); /* a chain: every slot seen is cached, seen and cached the same */
  size_t* at = malloc(tasks * sizeof(size_t));
  if (!q || !k || !v || !out || !pos || !seen || !at) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  srand(1);
  for (size_t i = 0; i < qf; i++) q[i] = frand();
  for (size_t i = 0; i < kvf; i++) k[i] = frand(), v[i] = frand();
  size_t slots = 0, total = 0;
  for (int s = 0; s < S; s++) pos[s] = c->ctx + s, seen[s] = c->ctx + s + 1, slots += (size_t)c->ctx + s + 1;
  for (size_t t = 0; t < tasks; t++) at[t] = total, total += (size_t)per * (c->heads / c->kv) * slots;
  float* scratch = malloc(total * sizeof(float));
  if (!scratch) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  const attn_problem p = {1, S, c->heads, c->kv, c->hd, cap, q, k, v, pos, out, per, scratch, at, 1.f / sqrtf((float)c->hd), seen, seen, NULL};
  return (Problem){p, tasks, qf};
}

int main(int argc, char** argv) {
  int rounds = 7, reps = 300;
  const char* shapes = "8/4/32/200,12/2/128/200,16/4/64/1000,32/8/64/1000,32/8/128/1000";
  const char* tokens = "1,5,9";
  task_fn libs[MAX_LIBS];
  const char* names[MAX_LIBS];
  const char* kernel = "?";
  int n_libs = 0;
  for (int i = 1; i < argc; i++) {
    const int valued = !strcmp(argv[i], "--rounds") || !strcmp(argv[i], "--reps") || !strcmp(argv[i], "--shapes") || !strcmp(argv[i], "--tokens");
    if (valued && i + 1 == argc) {
      fprintf(stderr, "%s needs a value (see the header of bench_attention_kernel.c)\n", argv[i]);
      return 2;
    }
    if (!strcmp(argv[i], "--rounds")) rounds = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[++i]);
    else if (!strcmp(argv[i], "--shapes")) shapes = argv[++i];
    else if (!strcmp(argv[i], "--tokens")) tokens = argv[++i];
    else if (argv[i][0] == '-') {
      fprintf(stderr, "unknown option %s (see the header of bench_attention_kernel.c)\n", argv[i]);
      return 2;
    } else if (n_libs == MAX_LIBS) {
      fprintf(stderr, "at most %d libraries\n", MAX_LIBS);
      return 2;
    } else {
      void* h = dlopen(argv[i], RTLD_NOW | RTLD_LOCAL);
      task_fn f = h ? (task_fn)dlsym(h, "attention_task") : NULL;
      if (!f) {
        fprintf(stderr, "%s: %s (build it as this file's header says: attention_task must be exported)\n", argv[i],
                h ? "no attention_task" : dlerror());
        return 2;
      }
      name_fn kernel_name = (name_fn)dlsym(h, "q4_kernel_name");
      if (!n_libs && kernel_name) kernel = kernel_name();
      libs[n_libs] = f, names[n_libs++] = argv[i];
    }
  }
  if (!n_libs || rounds < 1 || rounds > MAX_ROUNDS || reps < 1) {
    fprintf(stderr, "usage: bench_attention_kernel [--rounds 1..%d] [--reps R] [--shapes H/KV/HD/CTX,...] [--tokens 1,5,9] LIB [LIB ...]\n",
            MAX_ROUNDS);
    return 2;
  }
  Case cases[MAX_CASES];
  int n_cases = 0;
  for (const char* s = shapes; *s;) {
    Case c;
    int used = 0;
    if (sscanf(s, "%d/%d/%d/%d%n", &c.heads, &c.kv, &c.hd, &c.ctx, &used) != 4 || c.kv < 1 || c.heads < c.kv || c.heads % c.kv || c.hd < 1 ||
        c.hd > 4096 || c.ctx < 0 || c.ctx > 1 << 20) {
      fprintf(stderr, "--shapes: H/KV/HD/CTX, each >= 1 (CTX >= 0) and KV dividing H (got %s)\n", s);
      return 2;
    }
    s += used + (s[used] == ',');
    for (const char* t = tokens; *t;) {
      char* end;
      c.tokens = (int)strtol(t, &end, 10);
      if (end == t || c.tokens < 1 || c.tokens > 4096) {
        fprintf(stderr, "--tokens: a list of counts from 1 to 4096 (got %s)\n", tokens);
        return 2;
      }
      if (n_cases == MAX_CASES) {
        fprintf(stderr, "at most %d cases (shapes x token counts)\n", MAX_CASES);
        return 2;
      }
      cases[n_cases++] = c;
      t = end + (*end == ',');
    }
  }
  printf("CachedAttention's kernel alone, 1 thread, best of %d calls a round, %d rounds; kernel: %s\n", reps, rounds, kernel);
  for (int ci = 0; ci < n_cases; ci++) {
    const Case* c = &cases[ci];
    Problem pr = make_problem(c);
    float* first = malloc(pr.out_floats * sizeof(float));
    int same[MAX_LIBS];
    double us[MAX_LIBS][MAX_ROUNDS], ratio[MAX_LIBS][MAX_ROUNDS];
    for (int l = 0; l < n_libs; l++) { /* warm up, and each build's outputs against the first's */
      same[l] = 1;
      for (size_t t = 0; t < pr.tasks; t++) libs[l](&pr.p, t);
      if (l == 0) memcpy(first, pr.p.out, pr.out_floats * sizeof(float));
      else same[l] = !memcmp(first, pr.p.out, pr.out_floats * sizeof(float));
    }
    for (int r = 0; r < rounds; r++) {
      for (int j = 0; j < n_libs; j++) {
        const int l = (j + r) % n_libs;
        double best = 1e30;
        for (int i = 0; i < reps; i++) {
          const double t0 = now();
          for (size_t t = 0; t < pr.tasks; t++) libs[l](&pr.p, t);
          const double dt = now() - t0;
          best = dt < best ? dt : best;
        }
        us[l][r] = best * 1e6;
      }
      for (int l = 0; l < n_libs; l++) ratio[l][r] = us[l][r] / us[0][r];
    }
    printf("%d/%d heads of %d, context %d, %d token(s):\n", c->heads, c->kv, c->hd, c->ctx, c->tokens);
    for (int l = 0; l < n_libs; l++) {
      double lo = 1e30, hi = 0, rlo = 1e30, rhi = 0;
      for (int r = 0; r < rounds; r++) {
        lo = us[l][r] < lo ? us[l][r] : lo, hi = us[l][r] > hi ? us[l][r] : hi;
        rlo = ratio[l][r] < rlo ? ratio[l][r] : rlo, rhi = ratio[l][r] > rhi ? ratio[l][r] : rhi;
      }
      const double med = median(us[l], rounds), rmed = median(ratio[l], rounds);
      printf("  %-40s %9.1f us [%.1f-%.1f]", names[l], med, lo, hi);
      if (l) printf("  / first %.3f [%.3f-%.3f]  same bits: %s", rmed, rlo, rhi, same[l] ? "yes" : "NO");
      printf("\n");
    }
    free(first);
    free((void*)pr.p.q), free((void*)pr.p.k), free((void*)pr.p.v), free(pr.p.out), free((void*)pr.p.pos), free(pr.p.scratch);
    free((void*)pr.p.scratch_at), free((void*)pr.p.seen);
  }
  return 0;
}
