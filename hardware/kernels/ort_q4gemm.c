/* ONNX Runtime custom ops ai.specdec.cpu::Q4Gemm and Q8Gemm over q4_kernels.c / q8_kernels.c: one shared library,
 * loaded with SessionOptions.register_custom_ops_library (runtime/backends/onnxruntime/cpu.py).
 *
 *   Q4Gemm(x float [..., K], w uint8 [N/16, G, group/8, 64], scales float [N/16, G, 16],
 *          zero int32 [N/16, G, 16] or [1] (shared), splits int64 [outputs] (optional))
 *     -> y0 float [..., splits[0]], y1, ...     attributes: K, N, group_size, swiglu (0 or 1, optional)
 *   Q8Gemm: the same with w uint8 [N/16, G, group/4, 64] (int8 codes)
 *
 * One call quantizes the activations once and writes each output's columns of the product: a fused q|k|v or
 * gate|up projection needs no Split after it. With swiglu=1 the weight is gate|up and the one output [..., N/2] is
 * silu(gate) * up (swiglu.c).
 *
 * The library's other op, ai.specdec.cpu::CachedAttention, is ort_attention.c; the ONNX Runtime C API declarations both
 * use are ort_abi.h. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ort_abi.h"
#include "q4_kernels.h"

const OrtApi* ort_api;
extern OrtCustomOp cached_attention_op, rotary_cached_attention_op; /* ort_attention.c */
extern OrtCustomOp swiglu_op;                                       /* ort_swiglu.c */

typedef struct {
  int64_t K, N, group, bits, swiglu;
  q_weight_copy weights; /* the weights in 2 MiB pages, made at the first call (large_pages.c) */
} QKernel;

static OrtStatus* fail(int code, const char* msg) { return ort_fail(code, msg); }

static OrtCustomOp q4gemm_op, q8gemm_op;

/* an optional int attribute: `fallback` where the node does not set it */
static int64_t optional_attribute(const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t v;
  OrtStatus* st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, name, &v);
  if (!st) return v;
  CALL(ReleaseStatus_t, ReleaseStatus, st);
  return fallback;
}

static OrtStatus* create_kernel(const OrtCustomOp* op, const OrtApi* a, const OrtKernelInfo* info, void** out) {
  (void)a;
  QKernel k = {0};
  OrtStatus* st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "K", &k.K))) return st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "N", &k.N))) return st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "group_size", &k.group))) return st;
  k.bits = op == &q8gemm_op ? 8 : 4;
  k.swiglu = optional_attribute(info, "swiglu", 0);
  const int64_t rows_per_block = k.bits == 4 ? 8 : 4;
  if (k.K <= 0 || k.N <= 0 || k.group <= 0 || k.K > INT_MAX / 16 || k.N > INT_MAX / 16 || k.group % rows_per_block || k.K % k.group || k.N % 16)
    return fail(ERR_INVALID_ARGUMENT, k.bits == 4 ? "Q4Gemm: needs K a multiple of group_size, group_size of 8, N of 16"
                                                  : "Q8Gemm: needs K a multiple of group_size, group_size of 4, N of 16");
  if (k.bits == 8 && k.group > 65536) return fail(ERR_INVALID_ARGUMENT, "Q8Gemm: group_size over 65536 (its int32 sums could overflow)");
  if (k.swiglu && (k.swiglu != 1 || k.N % 32)) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: swiglu=1 needs N (gate|up) a multiple of 32");
  QKernel* kernel = malloc(sizeof *kernel);
  if (!kernel) return fail(ERR_FAIL, "Q4Gemm: out of memory");
  *kernel = k;
  *out = kernel;
  return NULL;
}

static void destroy_kernel(void* kernel) {
  q_weight_copy_release(&((QKernel*)kernel)->weights);
  free(kernel);
}

enum { MAX_PARTS = 8 };

/* the call's parallel work: blocks of 4 column tiles over each part (an output, or swiglu's gate); with swiglu a
   block computes the gate's tiles, the same tiles of the up half, then the gated output over those columns */
typedef struct {
  q_problem parts[MAX_PARTS];
  int first_block[MAX_PARTS + 1];
  int bits;
  const q_problem* up; /* swiglu: the up half, into a buffer beside the gate's */
  float* y;            /* swiglu: the output [M, N / 2] */
} Task;

static void gemm_tiles(int bits, const q_problem* p, int begin, int end) {
  if (bits == 8) q8_gemm_tiles(p, begin, end);
  else q4_gemm_tiles(p, begin, end);
}

static void run_block(void* data, size_t i) {
  const Task* task = data;
  int part = 0;
  while ((int)i >= task->first_block[part + 1]) part++;
  const q_problem* p = &task->parts[part];
  const int begin = ((int)i - task->first_block[part]) * 4, end = begin + 4 < p->N / 16 ? begin + 4 : p->N / 16;
  gemm_tiles(task->bits, p, begin, end);
  if (task->up) {
    gemm_tiles(task->bits, task->up, begin, end);
    swiglu_rows(p->y, task->up->y, p->N, task->y, p->N, p->M, begin * 16, end * 16);
  }
}

/* input i's data and dims (at most 8) */
static OrtStatus* input_data(OrtKernelContext* ctx, size_t i, const void** data, int64_t* dims, size_t* ndims) {
  const OrtValue* v;
  OrtStatus* st;
  if ((st = CALL(KernelContext_GetInput_t, KernelContext_GetInput, ctx, i, &v))) return st;
  if (!v) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: a required input is missing");
  OrtTensorTypeAndShapeInfo* info;
  if ((st = CALL(GetTensorTypeAndShape_t, GetTensorTypeAndShape, v, &info))) return st;
  st = CALL(GetDimensionsCount_t, GetDimensionsCount, info, ndims);
  if (!st && (*ndims < 1 || *ndims > 8)) st = fail(ERR_INVALID_ARGUMENT, "Q4Gemm: inputs must have 1 to 8 dimensions");
  if (!st) st = CALL(GetDimensions_t, GetDimensions, info, dims, *ndims);
  CALL(ReleaseTensorTypeAndShapeInfo_t, ReleaseTensorTypeAndShapeInfo, info);
  if (st) return st;
  return CALL(GetTensorMutableData_t, GetTensorMutableData, (OrtValue*)v, (void**)data);
}

/* input i's data and element count */
static OrtStatus* input_count(OrtKernelContext* ctx, size_t i, const void** data, int64_t* count) {
  int64_t dims[8];
  size_t ndims;
  OrtStatus* st = input_data(ctx, i, data, dims, &ndims);
  if (st) return st;
  *count = 1;
  for (size_t d = 0; d < ndims; d++) *count *= dims[d];
  return NULL;
}

/* the width of each output: the splits input (int64 [outputs], each a multiple of 16, summing to N), N / 2 with
   swiglu, else N */
static OrtStatus* output_widths(const QKernel* k, OrtKernelContext* ctx, int64_t* widths, size_t* count) {
  size_t inputs, outputs;
  OrtStatus* st;
  if ((st = CALL(KernelContext_GetInputCount_t, KernelContext_GetInputCount, ctx, &inputs))) return st;
  if ((st = CALL(KernelContext_GetOutputCount_t, KernelContext_GetOutputCount, ctx, &outputs))) return st;
  const OrtValue* splits = NULL;
  if (inputs > 4 && (st = CALL(KernelContext_GetInput_t, KernelContext_GetInput, ctx, 4, &splits))) return st;
  if (!splits) {
    if (outputs != 1) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: several outputs need a splits input");
    widths[0] = k->swiglu ? k->N / 2 : k->N;
    *count = 1;
    return NULL;
  }
  const void* data;
  int64_t n;
  if ((st = input_count(ctx, 4, &data, &n))) return st;
  if (k->swiglu || n != (int64_t)outputs || n < 1 || n > MAX_PARTS)
    return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: splits must give one width per output (at most 8), and swiglu has one output");
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    widths[i] = ((const int64_t*)data)[i];
    if (widths[i] <= 0 || widths[i] % 16) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: each split must be a positive multiple of 16");
    total += widths[i];
  }
  if (total != k->N) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: the splits do not sum to N");
  *count = (size_t)n;
  return NULL;
}

static OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
  QKernel* k = kernel;
  int64_t dims[8], widths[MAX_PARTS];
  size_t ndims = 0, outputs = 0;
  const void *x, *w, *sw, *zw;
  OrtStatus* st;
  if ((st = input_data(ctx, 0, &x, dims, &ndims))) return st;
  if (dims[ndims - 1] != k->K) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: x's last dimension is not K");
  const int G = (int)(k->K / k->group);
  const int64_t scales = k->N * G;
  int64_t nw, ns, nz;
  if ((st = input_count(ctx, 1, &w, &nw)) || (st = input_count(ctx, 2, &sw, &ns)) || (st = input_count(ctx, 3, &zw, &nz))) return st;
  if (nw != k->N * k->K * k->bits / 8 || ns != scales || (nz != scales && nz != 1))
    return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: a weight, scale or zero-point input does not match K, N and group_size");
  if ((st = output_widths(k, ctx, widths, &outputs))) return st;
  const void* weight_inputs[Q_COPY_PARTS] = {w, sw, zw};
  const size_t part_bytes[Q_COPY_PARTS] = {(size_t)nw, (size_t)ns * sizeof(float), (size_t)nz * sizeof(int32_t)};
  const int stream = q_weights_in_large_pages(&k->weights, weight_inputs, part_bytes, nz == 1 ? 2 : 3); /* a shared zero: as given */
  w = weight_inputs[0], sw = weight_inputs[1], zw = weight_inputs[2];
  int64_t M = 1;
  for (size_t d = 0; d + 1 < ndims; d++) M *= dims[d];
  float* ys[MAX_PARTS];
  for (size_t o = 0; o < outputs; o++) {
    OrtValue* out;
    dims[ndims - 1] = widths[o];
    if ((st = CALL(KernelContext_GetOutput_t, KernelContext_GetOutput, ctx, o, dims, ndims, &out))) return st;
    if ((st = CALL(GetTensorMutableData_t, GetTensorMutableData, out, (void**)&ys[o]))) return st;
  }
  if (M == 0) return NULL;
  if (M > INT_MAX / k->K || M > INT_MAX / k->N) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: too many rows");
  /* int8 activations, their scales and sums; with swiglu, the gate and up halves' outputs */
  const size_t act_bytes = (size_t)M * k->K + (size_t)M * G * (sizeof(float) + sizeof(int32_t));
  int8_t* qa = malloc(act_bytes + (k->swiglu ? (size_t)M * k->N * sizeof(float) : 0));
  if (!qa) return fail(ERR_FAIL, "Q4Gemm: out of memory");
  float* sa = (float*)(qa + (size_t)M * k->K); /* K is a multiple of 4: aligned for floats */
  int32_t* asum = (int32_t*)(sa + (size_t)M * G);
  q4_quantize_rows(x, (int)M, (int)k->K, (int)k->group, qa, sa, asum);
  const size_t tile_bytes = (size_t)k->K * 16 * k->bits / 8, tile_scales = (size_t)G * 16;
  Task task = {.bits = (int)k->bits};
  const q_problem whole = {(int)M, (int)k->K, (int)k->N, (int)k->group, qa, sa, asum, w, sw, zw, nz == 1, NULL, stream};
  q_problem up;
  int parts = (int)outputs, tile = 0;
  if (k->swiglu) { /* part 0: the gate's tiles into the first half of the buffer, `up`: the other half */
    float* halves = (float*)(qa + act_bytes); /* act_bytes is a multiple of 4 */
    task.parts[0] = whole;
    task.parts[0].N = (int)widths[0];
    task.parts[0].y = halves;
    up = task.parts[0];
    up.w = (const uint8_t*)w + (size_t)(widths[0] / 16) * tile_bytes;
    up.sw = (const float*)sw + (size_t)(widths[0] / 16) * tile_scales;
    up.zw = nz == 1 ? zw : (const int32_t*)zw + (size_t)(widths[0] / 16) * tile_scales;
    up.y = halves + (size_t)M * widths[0];
    task.up = &up;
    task.y = ys[0];
  } else
    for (int o = 0; o < parts; o++) { /* output o: its tiles of the weight, written to its own tensor */
      task.parts[o] = whole;
      task.parts[o].N = (int)widths[o];
      task.parts[o].w = (const uint8_t*)w + (size_t)tile * tile_bytes;
      task.parts[o].sw = (const float*)sw + (size_t)tile * tile_scales;
      task.parts[o].zw = nz == 1 ? zw : (const int32_t*)zw + (size_t)tile * tile_scales;
      task.parts[o].y = ys[o];
      tile += (int)(widths[o] / 16);
    }
  task.first_block[0] = 0;
  for (int o = 0; o < parts; o++) task.first_block[o + 1] = task.first_block[o] + (task.parts[o].N / 16 + 3) / 4;
  st = CALL(KernelContext_ParallelFor_t, KernelContext_ParallelFor, ctx, run_block, (size_t)task.first_block[parts], 0, (void*)&task);
  free(qa);
  return st;
}

static const char* q4_name(const OrtCustomOp* op) { (void)op; return "Q4Gemm"; }
static const char* q8_name(const OrtCustomOp* op) { (void)op; return "Q8Gemm"; }
static int input_type(const OrtCustomOp* op, size_t i) {
  (void)op;
  static const int types[5] = {TYPE_FLOAT, TYPE_UINT8, TYPE_FLOAT, TYPE_INT32, TYPE_INT64};
  return i < 5 ? types[i] : 0;
}
static size_t input_types(const OrtCustomOp* op) { (void)op; return 5; }
static int input_kind(const OrtCustomOp* op, size_t i) { (void)op; return i == 4 ? OPTIONAL : REQUIRED; /* splits */ }
static int output_kind(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return VARIADIC; /* one output per split */ }

#define QGEMM_OP(NAME)                                                                                              \
  {                                                                                                                  \
    OP_COMMON_FIELDS, .GetName = NAME, .GetInputType = input_type, .GetInputTypeCount = input_types,                 \
    .GetOutputType = op_float_type, .GetOutputTypeCount = op_one_output, .KernelDestroy = destroy_kernel,            \
    .GetInputCharacteristic = input_kind, .GetOutputCharacteristic = output_kind, .CreateKernelV2 = create_kernel,    \
    .KernelComputeV2 = compute,                                                                                      \
  }
static OrtCustomOp q4gemm_op = QGEMM_OP(q4_name), q8gemm_op = QGEMM_OP(q8_name);

__attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  ort_api = base->GetApi(API_VERSION);
  if (!ort_api) { /* an ONNX Runtime older than 1.17: say so with the oldest table, whose first slot is CreateStatus */
    ort_api = base->GetApi(1);
    return ort_api ? fail(ERR_FAIL, "specdec's CPU kernels need ONNX Runtime 1.17 or newer") : NULL;
  }
  OrtCustomOpDomain* domain;
  OrtStatus* st;
  if ((st = CALL(CreateCustomOpDomain_t, CreateCustomOpDomain, "ai.specdec.cpu", &domain))) return st;
  /* the domain must outlive every session that uses it: it is not released (as ONNX Runtime's own examples do) */
  if ((st = CALL(CustomOpDomain_Add_t, CustomOpDomain_Add, domain, &q4gemm_op))) return st;
  if ((st = CALL(CustomOpDomain_Add_t, CustomOpDomain_Add, domain, &q8gemm_op))) return st;
  if ((st = CALL(CustomOpDomain_Add_t, CustomOpDomain_Add, domain, &cached_attention_op))) return st;
  if ((st = CALL(CustomOpDomain_Add_t, CustomOpDomain_Add, domain, &rotary_cached_attention_op))) return st;
  if ((st = CALL(CustomOpDomain_Add_t, CustomOpDomain_Add, domain, &swiglu_op))) return st;
  return CALL(AddCustomOpDomain_t, AddCustomOpDomain, options, domain);
}

/* for hardware/cpu_kernels.py's report: which kernel this machine runs */
__attribute__((visibility("default"))) const char* specdec_q4_kernel_name(void) { return q4_kernel_name(); }
