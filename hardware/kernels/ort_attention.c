/* ONNX Runtime custom op ai.specdec.cpu::CachedAttention over attention.c, registered with Q4Gemm (ort_q4gemm.c):
 *
 *   CachedAttention(q float [B, S, heads * head_dim], key float [B, capacity, kv_heads * head_dim],
 *                   value float [B, capacity, kv_heads * head_dim], positions int64 [B, S])
 *     -> float [B, S, heads * head_dim]          attributes: num_heads, kv_num_heads
 *
 * key and value are the whole caches (TensorScatter's outputs, read in place: no Slice of the live slots); the token
 * at position p attends to slots 0..p of its row. The call's tasks, one per (row, token, KV head), go to ONNX
 * Runtime's intra-op threads as Q4Gemm's column blocks do; a task's bits do not depend on which thread runs it. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "attention.h"
#include "ort_abi.h"

typedef struct {
  int64_t heads, kv_heads;
} AttentionKernel;

static OrtStatus* create_attention(const OrtCustomOp* op, const OrtApi* a, const OrtKernelInfo* info, void** out) {
  (void)op, (void)a;
  AttentionKernel k;
  OrtStatus* st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "num_heads", &k.heads))) return st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "kv_num_heads", &k.kv_heads))) return st;
  if (k.heads <= 0 || k.kv_heads <= 0 || k.heads % k.kv_heads || k.heads / k.kv_heads > 64 || k.heads > 4096)
    return ort_fail(ERR_INVALID_ARGUMENT, "CachedAttention: num_heads must be a multiple of kv_num_heads, at most 64 query heads per KV head");
  AttentionKernel* kernel = malloc(sizeof *kernel);
  if (!kernel) return ort_fail(ERR_FAIL, "CachedAttention: out of memory");
  *kernel = k;
  *out = kernel;
  return NULL;
}

static void destroy_attention(void* kernel) { free(kernel); }

/* input i's data and its `rank` dims (a tensor of another rank is refused) */
static OrtStatus* input_of_rank(OrtKernelContext* ctx, size_t i, size_t rank, const void** data, int64_t* dims) {
  const OrtValue* v;
  OrtStatus* st;
  if ((st = CALL(KernelContext_GetInput_t, KernelContext_GetInput, ctx, i, &v))) return st;
  if (!v) return ort_fail(ERR_INVALID_ARGUMENT, "CachedAttention: a required input is missing");
  OrtTensorTypeAndShapeInfo* info;
  if ((st = CALL(GetTensorTypeAndShape_t, GetTensorTypeAndShape, v, &info))) return st;
  size_t n;
  st = CALL(GetDimensionsCount_t, GetDimensionsCount, info, &n);
  if (!st && n != rank) st = ort_fail(ERR_INVALID_ARGUMENT, "CachedAttention: q, key and value must be 3-D and positions 2-D");
  if (!st) st = CALL(GetDimensions_t, GetDimensions, info, dims, rank);
  CALL(ReleaseTensorTypeAndShapeInfo_t, ReleaseTensorTypeAndShapeInfo, info);
  if (st) return st;
  return CALL(GetTensorMutableData_t, GetTensorMutableData, (OrtValue*)v, (void**)data);
}

static void run_task(void* problem, size_t i) { attention_task(problem, i); }

static OrtStatus* compute_attention(void* kernel, OrtKernelContext* ctx) {
  const AttentionKernel* k = kernel;
  int64_t qd[3], kd[3], vd[3], pd[2];
  const void *q, *key, *value, *positions;
  OrtStatus* st;
  if ((st = input_of_rank(ctx, 0, 3, &q, qd)) || (st = input_of_rank(ctx, 1, 3, &key, kd)) || (st = input_of_rank(ctx, 2, 3, &value, vd)) ||
      (st = input_of_rank(ctx, 3, 2, &positions, pd)))
    return st;
  const int64_t B = qd[0], S = qd[1], hd = qd[2] / k->heads;
  if (qd[2] % k->heads || hd <= 0 || hd > 65536)
    return ort_fail(ERR_INVALID_ARGUMENT, "CachedAttention: q's last dimension is not num_heads x head_dim");
  if (kd[0] != B || kd[2] != k->kv_heads * hd || vd[0] != kd[0] || vd[1] != kd[1] || vd[2] != kd[2])
    return ort_fail(ERR_INVALID_ARGUMENT, "CachedAttention: key and value must both be [batch, capacity, kv_num_heads x head_dim]");
  if (pd[0] != B || pd[1] != S) return ort_fail(ERR_INVALID_ARGUMENT, "CachedAttention: positions must be [batch, tokens], as q");
  if (B > INT_MAX || S > INT_MAX || B * S > INT_MAX / k->heads) return ort_fail(ERR_INVALID_ARGUMENT, "CachedAttention: too many tokens");
  OrtValue* out;
  float* y;
  if ((st = CALL(KernelContext_GetOutput_t, KernelContext_GetOutput, ctx, 0, qd, 3, &out))) return st;
  if ((st = CALL(GetTensorMutableData_t, GetTensorMutableData, out, (void**)&y))) return st;
  const int per = attention_kv_per_task((int)k->kv_heads, (int)hd);
  const size_t parts = (size_t)(k->kv_heads / per), tasks = (size_t)B * parts, heads_per_task = (size_t)(per * (k->heads / k->kv_heads));
  if (tasks == 0 || S == 0) return NULL;
  /* each task's scores: its query heads x (each token's position + 1) floats */
  size_t* at = malloc(tasks * sizeof *at);
  if (!at) return ort_fail(ERR_FAIL, "CachedAttention: out of memory");
  size_t total = 0;
  for (int64_t b = 0; b < B; b++) {
    size_t slots = 0;
    for (int64_t s = 0; s < S; s++) {
      const int64_t p = ((const int64_t*)positions)[b * S + s];
      if (p < 0 || p >= kd[1]) {
        free(at);
        return ort_fail(ERR_INVALID_ARGUMENT, "CachedAttention: a position is outside the cache (each must be in [0, capacity))");
      }
      slots += (size_t)(p + 1);
    }
    for (size_t c = 0; c < parts; c++) {
      at[b * parts + c] = total;
      total += heads_per_task * slots;
    }
  }
  float* scratch = malloc(total * sizeof(float));
  if (!scratch) {
    free(at);
    return ort_fail(ERR_FAIL, "CachedAttention: out of memory");
  }
  const attn_problem problem = {(int)B, (int)S, (int)k->heads, (int)k->kv_heads, (int)hd, kd[1], q, key, value, positions, y, per, scratch, at,
                                1.f / sqrtf((float)hd)};
  st = CALL(KernelContext_ParallelFor_t, KernelContext_ParallelFor, ctx, run_task, tasks, 0, (void*)&problem);
  free(scratch);
  free(at);
  return st;
}

static const char* attention_name(const OrtCustomOp* op) { (void)op; return "CachedAttention"; }
static const char* cpu_provider(const OrtCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static int attention_input_type(const OrtCustomOp* op, size_t i) { (void)op; return i == 3 ? TYPE_INT64 : TYPE_FLOAT; }
static size_t four(const OrtCustomOp* op) { (void)op; return 4; }
static int float_type(const OrtCustomOp* op, size_t i) { (void)op, (void)i; return TYPE_FLOAT; }
static size_t single(const OrtCustomOp* op) { (void)op; return 1; }
static int required(const OrtCustomOp* op, size_t i) { (void)op, (void)i; return REQUIRED; }
static int default_memory(const OrtCustomOp* op, size_t i) { (void)op, (void)i; return 0; /* OrtMemTypeDefault */ }
static int first_version(const OrtCustomOp* op) { (void)op; return 1; }
static int last_version(const OrtCustomOp* op) { (void)op; return INT_MAX; }

OrtCustomOp cached_attention_op = {
    .version = API_VERSION, .GetName = attention_name, .GetExecutionProviderType = cpu_provider, .GetInputType = attention_input_type,
    .GetInputTypeCount = four, .GetOutputType = float_type, .GetOutputTypeCount = single, .KernelDestroy = destroy_attention,
    .GetInputCharacteristic = required, .GetOutputCharacteristic = required, .GetInputMemoryType = default_memory,
    .GetVariadicInputMinArity = first_version, .GetVariadicInputHomogeneity = first_version, .GetVariadicOutputMinArity = first_version,
    .GetVariadicOutputHomogeneity = first_version,
    .CreateKernelV2 = create_attention, .KernelComputeV2 = compute_attention, .GetStartVersion = first_version, .GetEndVersion = last_version,
};

/* for the accuracy test of the exp every kernel computes (tests/builder/test_cpu_attention.py) */
__attribute__((visibility("default"))) float specdec_attention_exp_probe(float x) { return specdec_attention_exp(x); }
