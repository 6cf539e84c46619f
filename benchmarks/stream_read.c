/* A STREAM-like read: each of T threads sums its slice of one buffer (8x the last-level cache by default), with
 * the widest vector loads the compiler targets (-O3 -march=native), so the figure is what the memory system gives
 * a kernel that only reads. Prints the best and the median of R passes, in bytes per second, by wall time and by
 * the threads' own CPU time (the slowest thread's): on a machine that other jobs share, a descheduled thread
 * stretches the wall time but not its CPU time, which then still says what the memory delivered while it ran.
 *
 *   stream_read BYTES THREADS PASSES
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
  const uint64_t* p;
  size_t n;
  uint64_t sum;
  pthread_barrier_t* start;
  double cpu_s, start_s, end_s; /* CPU time; wall clock at the first and the last read */
} Slice;

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static double thread_cpu(void) {
  struct timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void* read_slice(void* arg) {
  Slice* s = arg;
  pthread_barrier_wait(s->start);
  const double c0 = thread_cpu();
  s->start_s = now();
  uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
  for (size_t i = 0; i + 8 <= s->n; i += 8) { /* eight independent sums: the loads, not the adds, bound the loop */
    a0 += s->p[i], a1 += s->p[i + 1], a2 += s->p[i + 2], a3 += s->p[i + 3];
    a4 += s->p[i + 4], a5 += s->p[i + 5], a6 += s->p[i + 6], a7 += s->p[i + 7];
  }
  s->sum = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
  s->end_s = now();
  s->cpu_s = thread_cpu() - c0;
  return NULL;
}

static int cmp(const void* a, const void* b) { double x = *(const double*)a, y = *(const double*)b; return (x > y) - (x < y); }

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: stream_read BYTES THREADS PASSES\n");
    return 2;
  }
  const size_t bytes = strtoull(argv[1], 0, 10) & ~(size_t)63;
  const int threads = atoi(argv[2]), passes = atoi(argv[3]);
  if (threads < 1 || threads > 256 || passes < 1 || bytes < 4096) return 2;
  uint64_t* buf = aligned_alloc(64, bytes);
  if (!buf) return 1;
  memset(buf, 1, bytes); /* touch every page: the passes measure reads, not page faults */
  const size_t words = bytes / 8, per = words / threads / 8 * 8;
  double* rates = malloc(sizeof(double) * passes);
  double* cpu_rates = malloc(sizeof(double) * passes);
  uint64_t check = 0;
  for (int r = 0; r < passes; r++) {
    pthread_t tid[256];
    Slice sl[256];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, threads + 1);
    for (int t = 0; t < threads; t++) {
      sl[t] = (Slice){buf + (size_t)t * per, per, 0, &start, 0, 0, 0};
      pthread_create(&tid[t], NULL, read_slice, &sl[t]);
    }
    pthread_barrier_wait(&start);
    double slowest = 0, first = 1e300, last = 0;
    for (int t = 0; t < threads; t++) {
      pthread_join(tid[t], NULL);
      check += sl[t].sum;
      slowest = sl[t].cpu_s > slowest ? sl[t].cpu_s : slowest;
      first = sl[t].start_s < first ? sl[t].start_s : first;
      last = sl[t].end_s > last ? sl[t].end_s : last;
    }
    rates[r] = (double)per * 8 * threads / (last - first); /* timed by the readers themselves, not the main thread */
    cpu_rates[r] = (double)per * 8 * threads / slowest;
    pthread_barrier_destroy(&start);
  }
  qsort(rates, passes, sizeof(double), cmp);
  qsort(cpu_rates, passes, sizeof(double), cmp);
  printf("%.0f %.0f %.0f %.0f %llu\n", rates[passes - 1], rates[passes / 2], cpu_rates[passes - 1], cpu_rates[passes / 2],
         (unsigned long long)(check & 1));
  return 0;
}
