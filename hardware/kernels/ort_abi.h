/* The few declarations of ONNX Runtime's C API that specdec's custom ops use (ort_q4gemm.c, ort_attention.c).
 *
 * ONNX Runtime's Python wheel ships no C headers, so they are written here by hand: the C ABI is stable, OrtApi is a
 * table of function pointers that only grows at its end, and OrtCustomOp's fields are read up to the version it
 * declares. SLOT_* are positions in that table (the order of struct OrtApi in onnxruntime_c_api.h); API_VERSION 17 is
 * the first with KernelContext_ParallelFor. */
#pragma once
#include <limits.h>
#include <stddef.h>
#include <stdint.h>

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

enum { TYPE_FLOAT = 1, TYPE_UINT8 = 2, TYPE_INT32 = 6, TYPE_INT64 = 7, TYPE_BOOL = 9 }; /* ONNXTensorElementDataType */
enum { REQUIRED = 0, OPTIONAL = 1, VARIADIC = 2 };                         /* OrtCustomOpInputOutputCharacteristic */
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
  SLOT_KernelContext_GetInputCount = 88,
  SLOT_KernelContext_GetOutputCount = 89,
  SLOT_KernelContext_GetInput = 90,
  SLOT_KernelContext_GetOutput = 91,
  SLOT_ReleaseStatus = 93,
  SLOT_ReleaseTensorTypeAndShapeInfo = 99,
  SLOT_KernelContext_ParallelFor = 274,
};

/* the table RegisterCustomOps got (ort_q4gemm.c), for every op of the library */
extern const OrtApi* ort_api;
#define SLOT(name) (((void* const*)ort_api)[SLOT_##name])
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
typedef OrtStatus* (*KernelContext_GetInputCount_t)(const OrtKernelContext*, size_t*);
typedef OrtStatus* (*KernelContext_GetOutputCount_t)(const OrtKernelContext*, size_t*);
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


static inline OrtStatus* ort_fail(int code, const char* msg) { return CALL(CreateStatus_t, CreateStatus, code, msg); }

/* OrtCustomOp callbacks every op of the library shares (static: each op's file its own copy) */
static inline const char* op_cpu_provider(const OrtCustomOp* op) { (void)op; return "CPUExecutionProvider"; }
static inline int op_float_type(const OrtCustomOp* op, size_t i) { (void)op, (void)i; return TYPE_FLOAT; }
static inline size_t op_one_output(const OrtCustomOp* op) { (void)op; return 1; }
static inline int op_required(const OrtCustomOp* op, size_t i) { (void)op, (void)i; return REQUIRED; }
static inline int op_default_memory(const OrtCustomOp* op, size_t i) { (void)op, (void)i; return 0; /* OrtMemTypeDefault */ }
static inline int op_one(const OrtCustomOp* op) { (void)op; return 1; }
static inline int op_last_version(const OrtCustomOp* op) { (void)op; return INT_MAX; }
/* the fields every op of the library fills alike: the CPU provider, default memory, opset versions 1 on, no variadic
   input (and a variadic output, Q4Gemm's, of at least one homogeneous value) */
#define OP_COMMON_FIELDS                                                                                               \
  .version = API_VERSION, .GetExecutionProviderType = op_cpu_provider, .GetInputMemoryType = op_default_memory,     \
  .GetVariadicInputMinArity = op_one, .GetVariadicInputHomogeneity = op_one, .GetVariadicOutputMinArity = op_one,    \
  .GetVariadicOutputHomogeneity = op_one, .GetStartVersion = op_one, .GetEndVersion = op_last_version
