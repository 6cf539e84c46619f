/* A Q4Gemm/Q8Gemm node's weights, copied once into memory of 2 MiB pages (transparent huge pages).
 *
 * ONNX Runtime maps an engine's weights file into memory in 4 KiB pages. A decode step reads every weight once, and
 * in 4 KiB pages one core reads them well below the speed of the same bytes in 2 MiB pages: each page is a TLB miss
 * (a nested page walk in a virtual machine), and the hardware prefetcher stops at every page boundary. Measured on
 * an AMD EPYC (Zen 4) VM (benchmarks/bench_q4_kernel.c, --memory FILE against --memory huge), the file's pages read at
 * about 17-19 GB/s where 2 MiB pages read at 27-29. The file's pages cannot be collapsed into huge pages in place
 * (MADV_COLLAPSE refuses a file mapping without CONFIG_READ_ONLY_THP_FOR_FS), so the op copies its weights (w, and the
 * scales and zero points that go with them) at its first call into anonymous memory that it collapses into huge pages
 * (the nodes' copies packed back to back: none is rounded up to whole huge pages), and then drops ONNX Runtime's pages
 * of them from the process where they are an untouched private mapping of the file (MADV_DONTNEED: a later read would
 * fault the file's bytes back in, so ONNX Runtime's tensor stays valid), else asks for them to be paged out: the
 * process's resident memory stays about the same. (An engine's weights are always in its weights file,
 * builder/network_file.py, which ONNX Runtime maps; were they ONNX Runtime's own heap memory instead, the copy would
 * double them.) Each process holds its own copy: processes that serve one engine no longer share its weights' pages.
 *
 * Only where the copy really is in huge pages (MADV_COLLAPSE succeeded: Linux 6.1 or newer) is it used, and only for
 * inputs of at least 2 MiB; elsewhere the op reads ONNX Runtime's memory as before. The bits do not depend on where
 * the weights are. $SPECDEC_Q4_LARGE_PAGES=0 turns the copy off; =force copies every node's weights and takes the
 * one-stream passes even where no huge page was granted (tests: those passes on small weights).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4_kernels.h"

#if defined(__linux__)
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>
#ifndef MADV_COLLAPSE
#define MADV_COLLAPSE 25 /* Linux 6.1; older kernels answer EINVAL, and the copy is not used */
#endif
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21
#endif
#endif

enum { HUGE_PAGE = 2 << 20 };
static int copies_made; /* nodes whose weights this process has copied (specdec_q4_large_page_copies) */
enum { STATE_UNTRIED = 0, STATE_COPYING = 1, STATE_IN_USE = 2, STATE_DECLINED = 3 };

/* $SPECDEC_Q4_LARGE_PAGES: 0 off, 1 automatic (the default), 2 force */
static int large_pages_mode(void) {
  const char* v = getenv("SPECDEC_Q4_LARGE_PAGES");
  if (v && strcmp(v, "0") == 0) return 0;
  if (v && strcmp(v, "force") == 0) return 2;
  return 1;
}

#if defined(__linux__)
/* Whether [begin, end) lies in one private mapping of a file that no write has touched (no Anonymous pages in it, and
   none swapped out: a written page that went to swap counts under Swap, not Anonymous; by /proc/self/smaps): there,
   dropping its pages changes nothing but where they come from (a later read faults the file's bytes back in). Without
   both lines the answer is no, and the caller only pages them out. */
static int untouched_file_mapping(uintptr_t begin, uintptr_t end) {
  FILE* f = fopen("/proc/self/smaps", "r");
  if (!f) return 0;
  char line[512];
  int in = 0, file = 0, anonymous = -1, answer = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long lo, hi;
    char perms[8] = "", path[256] = "";
    if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %255s", &lo, &hi, perms, path) >= 3 && strchr(line, '-') < strchr(line, ' ')) {
      if (in) break; /* past the mapping, its Swap line never seen */
      in = lo <= begin && end <= hi;
      file = in && perms[3] == 'p' && path[0] == '/';
    } else if (in && strncmp(line, "Anonymous:", 10) == 0) {
      anonymous = (int)(strtoul(line + 10, NULL, 10) != 0);
    } else if (in && strncmp(line, "Swap:", 5) == 0) { /* after Anonymous in every mapping's lines */
      answer = file && anonymous == 0 && strtoul(line + 5, NULL, 10) == 0;
      break;
    }
  }
  fclose(f);
  return answer;
}

/* ONNX Runtime's pages of [p, p + n), once the copy holds their bytes: dropped from this process where that is safe
   (above), else only paged out (a hint, which skips pages that another process maps too) */
static void release_source(const void* p, size_t n) {
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), begin = ((uintptr_t)p + page - 1) & ~(page - 1),
                  end = ((uintptr_t)p + n) & ~(page - 1);
  if (end <= begin) return;
  if (untouched_file_mapping(begin, end)) madvise((void*)begin, end - begin, MADV_DONTNEED);
  else madvise((void*)begin, end - begin, MADV_PAGEOUT); /* its failure changes nothing */
}

/* The copies lie back to back in chunks of at least 64 MiB (nodes are copied at their first call, in the order a step
   runs them), so that no node rounds its copy up to whole huge pages: a chunk's address space is reserved whole, and
   only the pages copies fill (and the rest of their last huge page) become memory. A chunk is unmapped with its last
   copy. */
enum { CHUNK = 64 << 20 };
typedef struct Chunk {
  uint8_t* mapping;
  size_t mapped, used, size; /* used, size: from the chunk's first 2 MiB boundary */
  int copies;
} Chunk;
static pthread_mutex_t arena_lock = PTHREAD_MUTEX_INITIALIZER;
static Chunk* filling;      /* the chunk new copies go into */
static int collapse_fails;  /* MADV_COLLAPSE failed once (an older kernel, THP off): no more copies are tried */

/* n bytes (a multiple of 64) at the end of the filling chunk, or of a new one; NULL where no memory is left */
static uint8_t* arena_take(size_t n, Chunk** chunk) {
  pthread_mutex_lock(&arena_lock);
  if (!filling || filling->used + n > filling->size) {
    Chunk* c = calloc(1, sizeof *c);
    const size_t size = n > CHUNK ? (n + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE : CHUNK;
    uint8_t* m = c ? mmap(NULL, size + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (m == MAP_FAILED) {
      free(c);
      pthread_mutex_unlock(&arena_lock);
      return NULL;
    }
    *c = (Chunk){m, size + HUGE_PAGE, 0, size, 0};
    madvise((void*)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1)), size, MADV_HUGEPAGE);
    filling = c; /* the one before lives on while its copies do */
  }
  uint8_t* at = (uint8_t*)(((uintptr_t)filling->mapping + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1)) + filling->used;
  filling->used += n;
  filling->copies++;
  *chunk = filling;
  pthread_mutex_unlock(&arena_lock);
  return at;
}

static void arena_give_back(Chunk* c) {
  pthread_mutex_lock(&arena_lock);
  if (--c->copies == 0) { /* (the filling chunk too: the next session's copies start a new one) */
    if (c == filling) filling = NULL;
    munmap(c->mapping, c->mapped);
    free(c);
  }
  pthread_mutex_unlock(&arena_lock);
}

/* the copy of parts[0..count) one after another (each 64-byte aligned), or why not: 0 when made */
static int make_copy(q_weight_copy* c, const void* const* parts, const size_t* bytes, int count, int force) {
  size_t total = 0;
  for (int i = 0; i < count; i++) total += (bytes[i] + 63) & ~(size_t)63;
  if (!force && (total < HUGE_PAGE || __atomic_load_n(&collapse_fails, __ATOMIC_RELAXED))) return 1;
  Chunk* chunk;
  uint8_t* at = arena_take(total, &chunk);
  if (!at) return 1;
  size_t off = 0;
  for (int i = 0; i < count; i++) {
    memcpy(at + off, parts[i], bytes[i]);
    c->copy[i] = at + off;
    off += (bytes[i] + 63) & ~(size_t)63;
  }
  const uintptr_t begin = (uintptr_t)at & ~(uintptr_t)(HUGE_PAGE - 1),
                  end = ((uintptr_t)at + total + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1);
  if (madvise((void*)begin, end - begin, MADV_COLLAPSE) != 0 && !force) {
    __atomic_store_n(&collapse_fails, 1, __ATOMIC_RELAXED);
    arena_give_back(chunk);
    return 1;
  }
  c->chunk = chunk;
  for (int i = 0; i < count; i++) c->src[i] = parts[i];
  c->count = count;
  for (int i = 0; i < count; i++) release_source(parts[i], bytes[i]);
  __atomic_add_fetch(&copies_made, 1, __ATOMIC_RELAXED);
  return 0;
}
#endif

int q_weights_in_large_pages(q_weight_copy* c, const void** parts, const size_t* bytes, int count) {
  int state = __atomic_load_n(&c->state, __ATOMIC_ACQUIRE);
  if (state == STATE_UNTRIED) {
    int expected = STATE_UNTRIED;
    /* one caller copies; a call that comes meanwhile (concurrent Run calls) reads ONNX Runtime's memory */
    if (!__atomic_compare_exchange_n(&c->state, &expected, STATE_COPYING, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) return 0;
    const int mode = large_pages_mode();
    int declined = 1;
#if defined(__linux__)
    if (mode && count <= Q_COPY_PARTS) declined = make_copy(c, parts, bytes, count, mode == 2);
#endif
    state = declined ? STATE_DECLINED : STATE_IN_USE;
    __atomic_store_n(&c->state, state, __ATOMIC_RELEASE);
  }
  if (state != STATE_IN_USE || count != c->count) return 0;
  for (int i = 0; i < count; i++)
    if (parts[i] != c->src[i]) return 0; /* not the tensors copied (an input that is not a constant): as given */
  for (int i = 0; i < count; i++) parts[i] = c->copy[i];
  return 1;
}

void q_weight_copy_release(q_weight_copy* c) {
#if defined(__linux__)
  if (c->chunk) arena_give_back(c->chunk);
#endif
  c->chunk = NULL;
}

/* for tests and benchmarks: how many nodes' weights this process has copied */
__attribute__((visibility("default"))) int specdec_q4_large_page_copies(void) { return __atomic_load_n(&copies_made, __ATOMIC_RELAXED); }
