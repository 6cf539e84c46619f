/* Attention over a static-capacity KV cache read in place: the kernel behind ai.specdec.cpu::CachedAttention.
 *
 * The token at position p of row b attends to cache slots 0..p of its row (plugins/attention.py's rule: slot j is
 * visible iff j <= p), with scale 1 / sqrt(head_dim); query head h reads KV head h / (num_heads / kv_heads) (GQA).
 * In a tree call (tree given) token s of row b instead attends to the slots before the call's first, pos[b][0], then to
 * the call's tokens i that tree[b][s][i] names, in call order (token i's slot is pos[b][0] + i): its ancestors, then
 * itself, in path order wherever a parent comes before its children in the call (the runtime's trees: parents[j] < j;
 * a mask may name any of the call's tokens, all written before any is read, but the bits are a chain's only then). Its slots are then the same K/V rows, in the same order, as that token's in a chain once
 * its path is accepted, and its output the same bits: a tree is verified exactly as a chain (docs/precision.md).
 * A task is one row's tokens over kv_per_task of its KV heads with their query heads, slots outermost: each K/V row
 * is read once per call, for every token and query head of the task. A (token, head)'s operations depend only on
 * its position and the model's shape, never on how many rows or tokens the call has, how the heads are split into
 * tasks nor which thread runs them: a token's output is the same bits in a one-token step and in a verification
 * step (docs/precision.md). The AVX-512, AVX2 and portable kernels compute the same bits. */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int B, S, heads, kv_heads, head_dim;
  int64_t capacity;
  const float* q;          /* [B, S, heads * head_dim], after rotary */
  const float* k;          /* [B, capacity, kv_heads * head_dim]: the whole cache */
  const float* v;          /* the same */
  const int64_t* pos;      /* [B, S]: each in [0, capacity) (checked by the caller) */
  float* out;              /* [B, S, heads * head_dim] */
  int kv_per_task;         /* divides kv_heads */
  float* scratch;          /* the tasks' scores: task i's, kv_per_task x group x (sum of its tokens' seen) floats, at scratch_at[i] */
  const size_t* scratch_at;
  float scale;
  const int32_t* seen;     /* [B, S]: how many slots token s sees (pos + 1 in a chain), the length of its scores */
  const int32_t* cached;   /* [B, S]: of which the first `cached` are slots 0..cached - 1, read in slot order by the kernels'
                              passes (all of them in a chain: cached = seen); a tree token's others, the call's tokens it sees,
                              are read after them in call order (seen - cached of them) */
  const uint8_t* tree;     /* [B, S, S] bool, or NULL in a chain call: tree[b][s][i], token s sees the call's token i */
} attn_problem;

/* KV heads a task takes (a divisor of kv_heads), which changes no bit, only how the cache is read and the work shared:
   the fewest whose row segment is 512 bytes or more (a task then reads runs of 8 cache lines; one KV head of 32 floats
   a task, its 128 bytes a row, ran slower), so that the other tasks can go to other threads */
static inline int attention_kv_per_task(int kv_heads, int hd) {
  int per = 1;
  while (per < kv_heads && (kv_heads % per || (size_t)per * hd * sizeof(float) < 512)) per++;
  return per;
}

/* task i of B * kv_heads / kv_per_task: row i / (kv_heads / kv_per_task), KV heads from (i % (kv_heads / kv_per_task)) * kv_per_task */
void attention_task(const attn_problem* p, size_t i);
/* the scalar exp every kernel computes (exposed for the accuracy test): x clamped to >= -87 first */
float specdec_attention_exp(float x);

/* RotaryCachedAttention's problem (ort_attention.c): the step's q, k, v as the projection left them, rotated and written
   into the caches by the tasks themselves, then attended over as CachedAttention's. */
typedef struct {
  attn_problem attn;       /* q: q_rot below; k, v: the caches written (present, read in place where bound as past) */
  const float* q_in;       /* token (b, s)'s query heads at q_in + (b * S + s) * q_row, its KV heads' k at */
  const float* k_in;       /*   k_in + (b * S + s) * kv_row and v at v_in + (b * S + s) * kv_row: three views of one packed */
  const float* v_in;       /*   q|k|v tensor (q_row = kv_row = its width) or three tensors */
  size_t q_row, kv_row;
  float* q_rot;            /* [B, S, heads * head_dim]: the rotated queries, attn.q */
  float* key;              /* the caches attn reads, [B, capacity, kv_heads * head_dim], writable */
  float* value;
  const float* cos;        /* [positions, head_dim / 2]: a token at position p takes row p */
  const float* sin;
} rotary_attn_problem;

/* task i (attention_task's split): rotate the task's KV heads of row i's tokens into key at slots write + s (write: the
   row's first position, as TensorScatter's write index) with their values, its query heads into q_rot, then attend */
void rotary_attention_task(const rotary_attn_problem* p, size_t i);
/* y[0, hd) = x rotated by the angle whose cos and sin are c[0, hd / 2) and s (halves, not interleaved): as ONNX's
   RotaryEmbedding and ONNX Runtime's AVX2 kernel, y_i = fma(x_i, c_i, -(x_i+h * s_i)), y_i+h = fma(x_i, s_i, x_i+h * c_i) */
void attention_rotate(const float* x, const float* c, const float* s, int hd, float* y);
