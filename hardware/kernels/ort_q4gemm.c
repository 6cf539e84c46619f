/* ONNX Runtime custom op ai.specdec.cpu::Q4Gemm over q4_kernels.c: one shared library, loaded with
 * SessionOptions.register_custom_ops_library (runtime/backends/onnxruntime/cpu.py).
 *
 *   Q4Gemm(x float [..., K], w uint8 [N/16, G, group/8, 64], scales float [N/16, G, 16], zero int32 [N/16, G, 16])
 *     -> y float [..., N]        attributes: K, N, group_size
 *
 * ONNX Runtime's Python wheel ships no C headers, so the few declarations of its C API this op needs are
 * written here by hand: the C ABI is stable, OrtApi is a table of function pointers that only grows at its end,
 * and OrtCustomOp's fields are read up to the version it declares. SLOT_* are positions in that table (the order
 * of struct OrtApi in onnxruntime_c_api.h); API_VERSION 17 is the first with KernelContext_ParallelFor. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "q4_kernels.h"

#define API_VERSION 17

typedef struct OrtStatus OrtStatus;
typedef struct OrtApi OrtApi; /* opaque here: read as a table of pointers */
typedef struct OrtKernelInfo OrtKernelInfo;
typedef struct OrtKernelContext OrtKernelContext;
typedef struct OrtValue OrtValue;
typedef struct OrtTensorTypeAndShapeInfo OrtTensorTypeAndShapeInfo;
typedef struct OrtSessionOptions OrtSessionOptions;
typedef struct OrtCustomOpDomain OrtCustomOpDomain;

typedef struct {
  const OrtApi* (*GetApi)(uint32_t version);
  const char* (*GetVersionString)(void);
} OrtApiBase;

enum { TYPE_FLOAT = 1, TYPE_UINT8 = 2, TYPE_INT32 = 6 }; /* ONNXTensorElementDataType */
enum { ERR_FAIL = 1, ERR_INVALID_ARGUMENT = 2 };         /* OrtErrorCode */

enum {
  SLOT_CreateStatus = 0,
  SLOT_CreateCustomOpDomain = 26,
  SLOT_CustomOpDomain_Add = 27,
  SLOT_AddCustomOpDomain = 28,
  SLOT_GetTensorMutableData = 51,
  SLOT_GetDimensionsCount = 61,
  SLOT_GetDimensions = 62,
  SLOT_GetTensorTypeAndShape = 65,
  SLOT_KernelInfoGetAttribute_int64 = 86,
  SLOT_KernelContext_GetInput = 90,
  SLOT_KernelContext_GetOutput = 91,
  SLOT_ReleaseStatus = 93,
  SLOT_ReleaseTensorTypeAndShapeInfo = 99,
  SLOT_KernelContext_ParallelFor = 274,
};

static const OrtApi* api;
#define SLOT(name) (((void* const*)api)[SLOT_##name])
#define CALL(type, name, ...) (((type)SLOT(name))(__VA_ARGS__))

typedef OrtStatus* (*CreateStatus_t)(int, const char*);
typedef OrtStatus* (*CreateCustomOpDomain_t)(const char*, OrtCustomOpDomain**);
typedef OrtStatus* (*CustomOpDomain_Add_t)(OrtCustomOpDomain*, const void*);
typedef OrtStatus* (*AddCustomOpDomain_t)(OrtSessionOptions*, OrtCustomOpDomain*);
typedef OrtStatus* (*GetTensorMutableData_t)(OrtValue*, void**);
typedef OrtStatus* (*GetDimensionsCount_t)(const OrtTensorTypeAndShapeInfo*, size_t*);
typedef OrtStatus* (*GetDimensions_t)(const OrtTensorTypeAndShapeInfo*, int64_t*, size_t);
typedef OrtStatus* (*GetTensorTypeAndShape_t)(const OrtValue*, OrtTensorTypeAndShapeInfo**);
typedef OrtStatus* (*KernelInfoGetAttribute_int64_t)(const OrtKernelInfo*, const char*, int64_t*);
typedef OrtStatus* (*KernelContext_GetInput_t)(const OrtKernelContext*, size_t, const OrtValue**);
typedef OrtStatus* (*KernelContext_GetOutput_t)(OrtKernelContext*, size_t, const int64_t*, size_t, OrtValue**);
typedef void (*ReleaseStatus_t)(OrtStatus*);
typedef void (*ReleaseTensorTypeAndShapeInfo_t)(OrtTensorTypeAndShapeInfo*);
typedef OrtStatus* (*KernelContext_ParallelFor_t)(const OrtKernelContext*, void (*)(void*, size_t), size_t, size_t, void*);

/* OrtCustomOp, field for field (version 17 reads through GetEndVersion; the rest stays NULL) */
typedef struct OrtCustomOp {
  uint32_t version;
  void* (*CreateKernel)(const struct OrtCustomOp*, const OrtApi*, const OrtKernelInfo*);
  const char* (*GetName)(const struct OrtCustomOp*);
  const char* (*GetExecutionProviderType)(const struct OrtCustomOp*);
  int (*GetInputType)(const struct OrtCustomOp*, size_t);
  size_t (*GetInputTypeCount)(const struct OrtCustomOp*);
  int (*GetOutputType)(const struct OrtCustomOp*, size_t);
  size_t (*GetOutputTypeCount)(const struct OrtCustomOp*);
  void (*KernelCompute)(void*, OrtKernelContext*);
  void (*KernelDestroy)(void*);
  int (*GetInputCharacteristic)(const struct OrtCustomOp*, size_t);
  int (*GetOutputCharacteristic)(const struct OrtCustomOp*, size_t);
  int (*GetInputMemoryType)(const struct OrtCustomOp*, size_t);
  int (*GetVariadicInputMinArity)(const struct OrtCustomOp*);
  int (*GetVariadicInputHomogeneity)(const struct OrtCustomOp*);
  int (*GetVariadicOutputMinArity)(const struct OrtCustomOp*);
  int (*GetVariadicOutputHomogeneity)(const struct OrtCustomOp*);
  OrtStatus* (*CreateKernelV2)(const struct OrtCustomOp*, const OrtApi*, const OrtKernelInfo*, void**);
  OrtStatus* (*KernelComputeV2)(void*, OrtKernelContext*);
  OrtStatus* (*InferOutputShapeFn)(const struct OrtCustomOp*, void*);
  int (*GetStartVersion)(const struct OrtCustomOp*);
  int (*GetEndVersion)(const struct OrtCustomOp*);
  void* reserved[4]; /* GetMayInplace, ReleaseMayInplace, GetAliasMap, ReleaseAliasMap: not read at version 17 */
} OrtCustomOp;

typedef struct {
  int64_t K, N, group;
} Q4Kernel;

static OrtStatus* fail(int code, const char* msg) { return CALL(CreateStatus_t, CreateStatus, code, msg); }

static OrtStatus* create_kernel(const OrtCustomOp* op, const OrtApi* a, const OrtKernelInfo* info, void** out) {
  (void)op;
  (void)a;
  Q4Kernel k;
  OrtStatus* st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "K", &k.K))) return st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "N", &k.N))) return st;
  if ((st = CALL(KernelInfoGetAttribute_int64_t, KernelInfoGetAttribute_int64, info, "group_size", &k.group))) return st;
  if (k.K <= 0 || k.N <= 0 || k.group <= 0 || k.K > INT_MAX / 16 || k.N > INT_MAX / 16 || k.group % 8 || k.K % k.group || k.N % 16)
    return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: needs K a multiple of group_size, group_size of 8, N of 16");
  Q4Kernel* kernel = malloc(sizeof *kernel);
  if (!kernel) return fail(ERR_FAIL, "Q4Gemm: out of memory");
  *kernel = k;
  *out = kernel;
  return NULL;
}

static void destroy_kernel(void* kernel) { free(kernel); }

typedef struct {
  const q4_problem* problem;
  int tiles;
} Task;

static void run_block(void* data, size_t i) {
  const Task* task = data;
  const int begin = (int)i * 4, end = begin + 4 < task->tiles ? begin + 4 : task->tiles;
  q4_gemm_tiles(task->problem, begin, end);
}

/* input i's data and dims (at most 8) */
static OrtStatus* input_data(OrtKernelContext* ctx, size_t i, const void** data, int64_t* dims, size_t* ndims) {
  const OrtValue* v;
  OrtStatus* st;
  if ((st = CALL(KernelContext_GetInput_t, KernelContext_GetInput, ctx, i, &v))) return st;
  OrtTensorTypeAndShapeInfo* info;
  if ((st = CALL(GetTensorTypeAndShape_t, GetTensorTypeAndShape, v, &info))) return st;
  st = CALL(GetDimensionsCount_t, GetDimensionsCount, info, ndims);
  if (!st && (*ndims < 1 || *ndims > 8)) st = fail(ERR_INVALID_ARGUMENT, "Q4Gemm: inputs must have 1 to 8 dimensions");
  if (!st) st = CALL(GetDimensions_t, GetDimensions, info, dims, *ndims);
  CALL(ReleaseTensorTypeAndShapeInfo_t, ReleaseTensorTypeAndShapeInfo, info);
  if (st) return st;
  return CALL(GetTensorMutableData_t, GetTensorMutableData, (OrtValue*)v, (void**)data);
}

/* input i's data, refused unless it holds exactly `count` elements */
static OrtStatus* input_sized(OrtKernelContext* ctx, size_t i, const void** data, int64_t count) {
  int64_t dims[8], n = 1;
  size_t ndims;
  OrtStatus* st = input_data(ctx, i, data, dims, &ndims);
  if (st) return st;
  for (size_t d = 0; d < ndims; d++) n *= dims[d];
  return n == count ? NULL : fail(ERR_INVALID_ARGUMENT, "Q4Gemm: a weight, scale or zero-point input does not match K, N and group_size");
}

static OrtStatus* compute(void* kernel, OrtKernelContext* ctx) {
  const Q4Kernel* k = kernel;
  int64_t dims[8];
  size_t ndims = 0;
  const void *x, *w, *sw, *zw;
  OrtStatus* st;
  if ((st = input_data(ctx, 0, &x, dims, &ndims))) return st;
  if (dims[ndims - 1] != k->K) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: x's last dimension is not K");
  const int64_t scales = k->N * (k->K / k->group);
  if ((st = input_sized(ctx, 1, &w, k->N * k->K / 2)) || (st = input_sized(ctx, 2, &sw, scales)) || (st = input_sized(ctx, 3, &zw, scales)))
    return st;
  int64_t M = 1;
  for (size_t d = 0; d + 1 < ndims; d++) M *= dims[d];
  dims[ndims - 1] = k->N;
  OrtValue* out;
  if ((st = CALL(KernelContext_GetOutput_t, KernelContext_GetOutput, ctx, 0, dims, ndims, &out))) return st;
  float* y;
  if ((st = CALL(GetTensorMutableData_t, GetTensorMutableData, out, (void**)&y))) return st;
  if (M == 0) return NULL;
  if (M > INT_MAX / k->K) return fail(ERR_INVALID_ARGUMENT, "Q4Gemm: too many rows");
  const int G = (int)(k->K / k->group);
  int8_t* qa = malloc((size_t)M * k->K + (size_t)M * G * (sizeof(float) + sizeof(int32_t)));
  if (!qa) return fail(ERR_FAIL, "Q4Gemm: out of memory");
  float* sa = (float*)(qa + (size_t)M * k->K); /* K is a multiple of 8: aligned for floats */
  int32_t* asum = (int32_t*)(sa + (size_t)M * G);
  q4_quantize_rows(x, (int)M, (int)k->K, (int)k->group, qa, sa, asum);
  const q4_problem problem = {(int)M, (int)k->K, (int)k->N, (int)k->group, qa, sa, asum, w, sw, zw, y};
  const Task task = {&problem, (int)(k->N / 16)};
  st = CALL(KernelContext_ParallelFor_t, KernelContext_ParallelFor, ctx, run_block, (size_t)(task.tiles + 3) / 4, 0, (void*)&task);
  free(qa);
  return st;
}

static const char* op_name(const OrtCustomOp* op) { (void)op; return "Q4Gemm"; }
static const char* op_provider(const OrtCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static int input_type(const OrtCustomOp* op, size_t i) {
  (void)op;
  static const int types[4] = {TYPE_FLOAT, TYPE_UINT8, TYPE_FLOAT, TYPE_INT32};
  return i < 4 ? types[i] : 0;
}
static size_t input_count(const OrtCustomOp* op) { (void)op; return 4; }
static int output_type(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return TYPE_FLOAT; }
static size_t output_count(const OrtCustomOp* op) { (void)op; return 1; }
static int required(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; /* INPUT_OUTPUT_REQUIRED */ }
static int default_memory(const OrtCustomOp* op, size_t i) { (void)op; (void)i; return 0; /* OrtMemTypeDefault */ }
static int one(const OrtCustomOp* op) { (void)op; return 1; }
static int last_version(const OrtCustomOp* op) { (void)op; return INT_MAX; }

static OrtCustomOp q4gemm_op = {
    .version = API_VERSION,
    .GetName = op_name,
    .GetExecutionProviderType = op_provider,
    .GetInputType = input_type,
    .GetInputTypeCount = input_count,
    .GetOutputType = output_type,
    .GetOutputTypeCount = output_count,
    .KernelDestroy = destroy_kernel,
    .GetInputCharacteristic = required,
    .GetOutputCharacteristic = required,
    .GetInputMemoryType = default_memory,
    .GetVariadicInputMinArity = one,
    .GetVariadicInputHomogeneity = one,
    .GetVariadicOutputMinArity = one,
    .GetVariadicOutputHomogeneity = one,
    .CreateKernelV2 = create_kernel,
    .KernelComputeV2 = compute,
    .GetStartVersion = one,
    .GetEndVersion = last_version,
};

__attribute__((visibility("default"))) OrtStatus* RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* base) {
  api = base->GetApi(API_VERSION);
  if (!api) { /* an ONNX Runtime older than 1.17: say so with the oldest table, whose first slot is CreateStatus */
    api = base->GetApi(1);
    return api ? fail(ERR_FAIL, "specdec's CPU kernels need ONNX Runtime 1.17 or newer") : NULL;
  }
  OrtCustomOpDomain* domain;
  OrtStatus* st;
  if ((st = CALL(CreateCustomOpDomain_t, CreateCustomOpDomain, "ai.specdec.cpu", &domain))) return st;
  /* the domain must outlive every session that uses it: it is not released (as ONNX Runtime's own examples do) */
  if ((st = CALL(CustomOpDomain_Add_t, CustomOpDomain_Add, domain, &q4gemm_op))) return st;
  return CALL(AddCustomOpDomain_t, AddCustomOpDomain, options, domain);
}

/* for hardware/cpu_kernels.py's report: which kernel this machine runs */
__attribute__((visibility("default"))) const char* specdec_q4_kernel_name(void) { return q4_kernel_name(); }
