/* ONNX Runtime custom op ai.specdec.cpu::CachedAttention over attention.c, registered with Q4Gemm (ort_q4gemm.c):
 *
 *   CachedAttention(q float [B, S, heads * head_dim], key float [B, capacity, kv_heads * head_dim],
 *                   value float [B, capacity, kv_heads * head_dim], positions int64 [B, S])
 *     -> float [B, S, heads * head_dim]          attributes: num_heads, kv_num_heads
 *
 * key and value are the whole caches (TensorScatter's outputs, read in place: no Slice of the live slots); the token
 * at position p attends to slots 0..p of its row. The call's tasks, one per (row, token, KV head), go to ONNX
 * Runtime's intra-op threads as Q4Gemm's column blocks do; a task's bits do not depend on which thread runs it.
 *
 *   RotaryCachedAttention(query float [B, S, heads * head_dim] or the packed [B, S, (heads + 2 kv_heads) * head_dim],
 *                         key, value float [B, S, kv_heads * head_dim] (both absent with a packed query),
 *                         past_key, past_value float [B, capacity, kv_heads * head_dim], positions int64 [B, S],
 *                         cos_cache, sin_cache float [max_position, head_dim / 2], tree_mask bool [B, S, S] (optional))
 *     -> (float [B, S, heads * head_dim], present_key, present_value)     attributes: num_heads, kv_num_heads
 *
 * One node for a layer's RotaryEmbedding of q and k, both TensorScatters and CachedAttention (and the Split of a packed
 * q|k|v): each task rotates its own KV heads' keys of its row's tokens into the cache at slots positions[b][0] + s (as
 * TensorScatter writes at the row's write index), its query heads into a scratch, and attends. The caches are written in
 * place when present is bound to past's buffer (the runtime binds them so); otherwise past is copied to present first.
 * Rotary is non-interleaved over the whole head (the builder refuses partial rotary), in ONNX Runtime's AVX2 arithmetic:
 * the same bits as RotaryEmbedding on AVX2 hosts. With tree_mask (a tree engine's verification step), token s sees the
 * slots before the row's first position and the call's tokens i where tree_mask[b][s][i], itself among them, each in
 * order (attention.h): a tree token's output is the same bits as in a chain once its path is accepted. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "ort_abi.h"

typedef struct {
  int64_t heads, kv_heads;
  const char* name; /* the op's, for its errors */
} AttentionKernel;

/* "<op>: <what>" as an ONNX Runtime error */
static OrtStatus* op_fail(int code, const char* op, const char* what) {
  char msg[512];
  snprintf(msg, sizeof msg, "%s: %s", op, what);
  return ort_fail(code, msg);
}

static OrtStatus* create_attention(const OrtCustomOp* op, const OrtApi* a, const OrtKernelInfo* info, void** out) {
  (void)a;
  AttentionKernel k = {.name = op->GetName(op)};
  OrtStatus* st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "num_heads", &k.heads))) return st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "kv_num_heads", &k.kv_heads))) return st;
  if (k.heads <= 0 || k.kv_heads <= 0 || k.heads % k.kv_heads || k.heads / k.kv_heads > 64 || k.heads > 4096)
    return op_fail(ERR_INVALID_ARGUMENT, k.name, "num_heads must be a multiple of kv_num_heads, at most 64 query heads per KV head");
  AttentionKernel* kernel = malloc(sizeof *kernel);
  if (!kernel) return op_fail(ERR_FAIL, k.name, "out of memory");
  *kernel = k;
  *out = kernel;
  return NULL;
}

static void destroy_attention(void* kernel) { free(kernel); }

/* whether input i is given (an optional input left empty is not), into *given */
static OrtStatus* has_input(OrtKernelContext* ctx, size_t i, int* given) {
  size_t n = 0;
  const OrtValue* v = NULL;
  OrtStatus* st = CALL(KernelContext_GetInputCount_t, KernelContext_GetInputCount, ctx, &n);
  if (!st && i < n) st = CALL(KernelContext_GetInput_t, KernelContext_GetInput, ctx, i, &v);
  *given = v != NULL;
  return st;
}

/* input i's data and its `rank` dims (a tensor of another rank is refused); `name`: the input's, for the error */
static OrtStatus* input_of_rank(const AttentionKernel* k, OrtKernelContext* ctx, size_t i, const char* name, size_t rank, const void** data,
                                int64_t* dims) {
  const OrtValue* v;
  OrtStatus* st;
  char what[128];
  if ((st = CALL(KernelContext_GetInput_t, KernelContext_GetInput, ctx, i, &v))) return st;
  if (!v) {
    snprintf(what, sizeof what, "the input %s is missing", name);
    return op_fail(ERR_INVALID_ARGUMENT, k->name, what);
  }
  OrtTensorTypeAndShapeInfo* info;
  if ((st = CALL(GetTensorTypeAndShape_t, GetTensorTypeAndShape, v, &info))) return st;
  size_t n;
  st = CALL(GetDimensionsCount_t, GetDimensionsCount, info, &n);
  if (!st && n != rank) {
    snprintf(what, sizeof what, "%s must be %zu-D", name, rank);
    st = op_fail(ERR_INVALID_ARGUMENT, k->name, what);
  }
  if (!st) st = CALL(GetDimensions_t, GetDimensions, info, dims, rank);
  CALL(ReleaseTensorTypeAndShapeInfo_t, ReleaseTensorTypeAndShapeInfo, info);
  if (st) return st;
  return CALL(GetTensorMutableData_t, GetTensorMutableData, (OrtValue*)v, (void**)data);
}

static void run_task(void* problem, size_t i) { attention_task(problem, i); }

/* the slots token s of row b sees, seen[b S + s], and how many of them are the cache's first ones, cached[b S + s]: in a
   chain (tree NULL) slots 0..position, all cached; in a tree, the slots before the row's first position and the call's
   tokens its tree_mask row names. A tree token that sees the call's tokens 0..s at position first + s is a chain's
   token and is read as one (the same bits, by the kernels' faster passes); any other reads its call tokens after. */
static OrtStatus* token_slots(const AttentionKernel* k, int64_t B, int64_t S, const int64_t* positions, const uint8_t* tree,
                              int32_t* seen, int32_t* cached) {
  for (int64_t b = 0; b < B; b++)
    for (int64_t s = 0; s < S; s++) {
      const int64_t t = b * S + s, p = positions[t], first = positions[b * S];
      seen[t] = cached[t] = (int32_t)(p + 1);
      if (!tree) continue;
      const uint8_t* sees = tree + t * S;
      if (!sees[s]) return op_fail(ERR_INVALID_ARGUMENT, k->name, "tree_mask[b][s][s] must be true for every token (a token sees itself)");
      int64_t count = 0, prefix = 1; /* call tokens seen; whether they are 0..s */
      for (int64_t i = 0; i < S; i++) {
        count += sees[i] != 0;
        prefix &= (i <= s) == (sees[i] != 0);
      }
      if (!(prefix && p == first + s)) seen[t] = (int32_t)(first + count), cached[t] = (int32_t)first;
    }
  return NULL;
}

/* the call's tasks (one per row and block of `per` KV heads) and their score scratch: each task's query heads x the sum
   of its tokens' slots seen; every position checked to lie in [0, capacity) first, then token_slots (tree: a tree step's
   mask, or NULL) into *slots (seen, then cached: 2 B S int32). No tasks (and nothing allocated) for an empty call. */
static OrtStatus* plan_tasks(const AttentionKernel* k, int64_t B, int64_t S, int per, const int64_t* positions, int64_t capacity,
                             const uint8_t* tree, size_t* tasks, size_t** at, float** scratch, int32_t** slots) {
  const size_t parts = (size_t)(k->kv_heads / per), heads_per_task = (size_t)(per * (k->heads / k->kv_heads));
  *tasks = (size_t)B * parts;
  *at = NULL, *scratch = NULL, *slots = NULL;
  if (*tasks == 0 || S == 0) {
    *tasks = 0;
    return NULL;
  }
  for (int64_t t = 0; t < B * S; t++)
    if (positions[t] < 0 || positions[t] >= capacity)
      return op_fail(ERR_INVALID_ARGUMENT, k->name, "a position is outside the cache (each must be in [0, capacity))");
  *at = malloc(*tasks * sizeof **at);
  *slots = malloc(2 * (size_t)(B * S) * sizeof **slots);
  OrtStatus* st = !*at || !*slots ? op_fail(ERR_FAIL, k->name, "out of memory") : NULL;
  const int32_t* seen = *slots;
  if (!st) st = token_slots(k, B, S, positions, tree, *slots, *slots + B * S);
  size_t total = 0;
  for (int64_t b = 0; b < B && !st; b++) {
    size_t row = 0;
    for (int64_t s = 0; s < S; s++) row += (size_t)seen[b * S + s];
    for (size_t c = 0; c < parts; c++) {
      (*at)[b * parts + c] = total;
      total += heads_per_task * row;
    }
  }
  if (!st && !(*scratch = malloc(total * sizeof(float)))) st = op_fail(ERR_FAIL, k->name, "out of memory");
  if (st) {
    free(*at), free(*slots);
    *at = NULL, *slots = NULL;
  }
  return st;
}

/* output i of `rank` dims `dims`, and its data */
static OrtStatus* output_of(OrtKernelContext* ctx, size_t i, const int64_t* dims, size_t rank, float** data) {
  OrtValue* out;
  OrtStatus* st = CALL(KernelContext_GetOutput_t, KernelContext_GetOutput, ctx, i, dims, rank, &out);
  return st ? st : CALL(GetTensorMutableData_t, GetTensorMutableData, out, (void**)data);
}

static OrtStatus* compute_attention(void* kernel, OrtKernelContext* ctx) {
  const AttentionKernel* k = kernel;
  int64_t qd[3], kd[3], vd[3], pd[2];
  const void *q, *key, *value, *positions;
  OrtStatus* st;
  if ((st = input_of_rank(k, ctx, 0, "q", 3, &q, qd)) || (st = input_of_rank(k, ctx, 1, "key", 3, &key, kd)) ||
      (st = input_of_rank(k, ctx, 2, "value", 3, &value, vd)) || (st = input_of_rank(k, ctx, 3, "positions", 2, &positions, pd)))
    return st;
  const int64_t B = qd[0], S = qd[1], hd = qd[2] / k->heads;
  if (qd[2] % k->heads || hd <= 0 || hd > 65536)
    return op_fail(ERR_INVALID_ARGUMENT, k->name, "q's last dimension is not num_heads x head_dim");
  if (kd[0] != B || kd[2] != k->kv_heads * hd || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2])
    return op_fail(ERR_INVALID_ARGUMENT, k->name, "key and value must both be [batch, capacity, kv_num_heads x head_dim]");
  if (pd[0] != B || pd[1] != S) return op_fail(ERR_INVALID_ARGUMENT, k->name, "positions must be [batch, tokens], as q");
  if (B > INT_MAX || S > INT_MAX || B * S > INT_MAX / k->heads) return op_fail(ERR_INVALID_ARGUMENT, k->name, "too many tokens");
  float* y;
  if ((st = output_of(ctx, 0, qd, 3, &y))) return st;
  const int per = attention_kv_per_task((int)k->kv_heads, (int)hd);
  size_t *at, tasks;
  float* scratch;
  int32_t* slots;
  if ((st = plan_tasks(k, B, S, per, positions, kd[1], NULL, &tasks, &at, &scratch, &slots)) || !tasks) return st;
  const attn_problem problem = {(int)B, (int)S, (int)k->heads, (int)k->kv_heads, (int)hd, kd[1], q, key, value, positions, y, per, scratch, at,
                                1.f / sqrtf((float)hd), slots, slots + B * S, NULL};
  st = CALL(KernelContext_ParallelFor_t, KernelContext_ParallelFor, ctx, run_task, tasks, 0, (void*)&problem);
  free(scratch);
  free(at);
  free(slots);
  return st;
}

static void run_rotary_task(void* problem, size_t i) { rotary_attention_task(problem, i); }

static OrtStatus* compute_rotary_attention(void* kernel, OrtKernelContext* ctx) {
  const AttentionKernel* k = kernel;
  const char* name = k->name;
  int64_t qd[3], kd[3], vd[3], pkd[3], pvd[3], pd[2], cd[2], sd[2], td[3];
  const void *q, *kin = NULL, *vin = NULL, *past_k, *past_v, *positions, *cos, *sin, *tree = NULL;
  OrtStatus* st;
  int has_key, has_value, has_tree;
  if ((st = has_input(ctx, 1, &has_key)) || (st = has_input(ctx, 2, &has_value)) || (st = has_input(ctx, 8, &has_tree))) return st;
  const int separate = has_key + has_value;
  if (separate == 1) return op_fail(ERR_INVALID_ARGUMENT, name, "key and value are given together, or neither (with a packed q|k|v query)");
  if ((st = input_of_rank(k, ctx, 0, "query", 3, &q, qd)) || (separate && (st = input_of_rank(k, ctx, 1, "key", 3, &kin, kd))) ||
      (separate && (st = input_of_rank(k, ctx, 2, "value", 3, &vin, vd))) || (st = input_of_rank(k, ctx, 3, "past_key", 3, &past_k, pkd)) ||
      (st = input_of_rank(k, ctx, 4, "past_value", 3, &past_v, pvd)) || (st = input_of_rank(k, ctx, 5, "positions", 2, &positions, pd)) ||
      (st = input_of_rank(k, ctx, 6, "cos_cache", 2, &cos, cd)) || (st = input_of_rank(k, ctx, 7, "sin_cache", 2, &sin, sd)) ||
      (has_tree && (st = input_of_rank(k, ctx, 8, "tree_mask", 3, &tree, td))))
    return st;
  const int64_t B = qd[0], S = qd[1], width = k->heads + (separate ? 0 : 2 * k->kv_heads), hd = qd[2] / width, kvw = k->kv_heads * hd;
  if (qd[2] % width || hd <= 0 || hd % 2 || hd > 65536)
    return op_fail(ERR_INVALID_ARGUMENT, name, separate ? "query's last dimension is not num_heads x head_dim (head_dim even)"
                                                        : "a packed query's last dimension is not (num_heads + 2 kv_num_heads) x head_dim (head_dim even)");
  if (separate && (kd[0] != B || kd[1] != S || kd[2] != kvw || memcmp(kd, vd, sizeof kd)))
    return op_fail(ERR_INVALID_ARGUMENT, name, "key and value must both be [batch, tokens, kv_num_heads x head_dim], as query");
  if (pkd[0] != B || pkd[2] != kvw || memcmp(pkd, pvd, sizeof pkd))
    return op_fail(ERR_INVALID_ARGUMENT, name, "past_key and past_value must both be [batch, capacity, kv_num_heads x head_dim]");
  if (pd[0] != B || pd[1] != S) return op_fail(ERR_INVALID_ARGUMENT, name, "positions must be [batch, tokens], as query");
  if (has_tree && (td[0] != B || td[1] != S || td[2] != S))
    return op_fail(ERR_INVALID_ARGUMENT, name, "tree_mask must be [batch, tokens, tokens], as query");
  if (cd[1] != hd / 2 || memcmp(cd, sd, sizeof cd))
    return op_fail(ERR_INVALID_ARGUMENT, name, "cos_cache and sin_cache must both be [positions, head_dim / 2]");
  if (B > INT_MAX || S > INT_MAX || B * S > INT_MAX / k->heads) return op_fail(ERR_INVALID_ARGUMENT, name, "too many tokens");
  const int64_t capacity = pkd[1], *pos = positions;
  for (int64_t b = 0; b < B && S > 0; b++) {
    if (pos[b * S] < 0 || pos[b * S] > capacity - S)
      return op_fail(ERR_INVALID_ARGUMENT, name, "a row's tokens do not fit the cache (they are written from its first position on: "
                                                 "positions[b][0] + tokens must be at most capacity)");
    for (int64_t s = 0; s < S; s++)
      if (pos[b * S + s] >= cd[0]) return op_fail(ERR_INVALID_ARGUMENT, name, "a position is past cos_cache's and sin_cache's rows");
  }
  /* the tasks first: plan_tasks refuses a position outside the cache before any output is written */
  const int per = attention_kv_per_task((int)k->kv_heads, (int)hd);
  size_t *at, tasks;
  float* scratch;
  int32_t* slots;
  if ((st = plan_tasks(k, B, S, per, positions, capacity, tree, &tasks, &at, &scratch, &slots))) return st;
  const int64_t yd[3] = {B, S, k->heads * hd};
  float *y, *key, *value, *q_rot = NULL;
  if ((st = output_of(ctx, 0, yd, 3, &y)) || (st = output_of(ctx, 1, pkd, 3, &key)) || (st = output_of(ctx, 2, pvd, 3, &value)))
    goto done;
  /* present bound to past's buffer (the runtime's binding): written in place; else present starts as a copy of past */
  const size_t cache_bytes = (size_t)B * (size_t)capacity * (size_t)kvw * sizeof(float);
  if (key != past_k) memcpy(key, past_k, cache_bytes);
  if (value != past_v) memcpy(value, past_v, cache_bytes);
  if (!tasks) goto done;
  q_rot = malloc((size_t)(B * S * k->heads * hd) * sizeof(float));
  if (!q_rot) {
    st = op_fail(ERR_FAIL, name, "out of memory");
    goto done;
  }
  const float* qf = q;
  const rotary_attn_problem problem = {
      .attn = {(int)B, (int)S, (int)k->heads, (int)k->kv_heads, (int)hd, capacity, q_rot, key, value, positions, y, per, scratch, at,
               1.f / sqrtf((float)hd), slots, slots + B * S, tree},
      .q_in = qf,
      .k_in = separate ? kin : qf + k->heads * hd,
      .v_in = separate ? vin : qf + (k->heads + k->kv_heads) * hd,
      .q_row = (size_t)qd[2],
      .kv_row = separate ? (size_t)kvw : (size_t)qd[2],
      .q_rot = q_rot,
      .key = key,
      .value = value,
      .cos = cos,
      .sin = sin,
  };
  st = CALL(KernelContext_ParallelFor_t, KernelContext_ParallelFor, ctx, run_rotary_task, tasks, 0, (void*)&problem);
done:
  free(q_rot);
  free(scratch);
  free(at);
  free(slots);
  return st;
}

static const char* attention_name(const OrtCustomOp* op) { (void)op; return "CachedAttention"; }
static const char* rotary_attention_name(const OrtCustomOp* op) { (void)op; return "RotaryCachedAttention"; }
static int rotary_input_type(const OrtCustomOp* op, size_t i) { (void)op; return i == 5 ? TYPE_INT64 : i == 8 ? TYPE_BOOL : TYPE_FLOAT; }
static size_t nine(const OrtCustomOp* op) { (void)op; return 9; }
static size_t three(const OrtCustomOp* op) { (void)op; return 3; }
static int key_value_tree_optional(const OrtCustomOp* op, size_t i) { (void)op; return i == 1 || i == 2 || i == 8 ? OPTIONAL : REQUIRED; }
static int attention_input_type(const OrtCustomOp* op, size_t i) { (void)op; return i == 3 ? TYPE_INT64 : TYPE_FLOAT; }
static size_t four(const OrtCustomOp* op) { (void)op; return 4; }

OrtCustomOp cached_attention_op = {
    OP_COMMON_FIELDS, .GetName = attention_name, .GetInputType = attention_input_type, .GetInputTypeCount = four,
    .GetOutputType = op_float_type, .GetOutputTypeCount = op_one_output, .GetInputCharacteristic = op_required,
    .GetOutputCharacteristic = op_required, .CreateKernelV2 = create_attention, .KernelComputeV2 = compute_attention,
    .KernelDestroy = destroy_attention,
};

OrtCustomOp rotary_cached_attention_op = {
    OP_COMMON_FIELDS, .GetName = rotary_attention_name, .GetInputType = rotary_input_type, .GetInputTypeCount = nine,
    .GetOutputType = op_float_type, .GetOutputTypeCount = three, .GetInputCharacteristic = key_value_tree_optional,
    .GetOutputCharacteristic = op_required, .CreateKernelV2 = create_attention, .KernelComputeV2 = compute_rotary_attention,
    .KernelDestroy = destroy_attention,
};

/* for the accuracy test of the exp every kernel computes (tests/builder/test_cpu_attention.py) */
__attribute__((visibility("default"))) float specdec_attention_exp_probe(float x) { return specdec_attention_exp(x); }
