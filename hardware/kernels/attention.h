/* Attention over a static-capacity KV cache read in place: the kernel behind ai.specdec.cpu::CachedAttention.
 *
 * The token at position p of row b attends to cache slots 0..p of its row (plugins/attention.py's rule: slot j is
 * visible iff j <= p), with scale 1 / sqrt(head_dim); query head h reads KV head h / (num_heads / kv_heads) (GQA).
 * One task is one (row, token, KV head): its query heads go together, so each K/V row is read once per token. A
 * task's instructions depend only on its position and the model's shape, never on how many rows or tokens the
 * call has nor on which thread runs it: a token's output is the same bits in a one-token step and in a
 * verification step (docs/precision.md). The AVX-512, AVX2 and portable kernels compute the same bits. */
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
  float* scratch;          /* the tasks' scores: task i's [group][pos + 1] floats at scratch_at[i] */
  const size_t* scratch_at;
  float scale;
} attn_problem;

/* task i of B * S * kv_heads: row i / (S * kv_heads), token (i / kv_heads) % S, KV head i % kv_heads */
void attention_task(const attn_problem* p, size_t i);
/* the scalar exp every kernel computes (exposed for the accuracy test): x clamped to >= -87 first */
float specdec_attention_exp(float x);
