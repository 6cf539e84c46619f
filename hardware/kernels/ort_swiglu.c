/* ONNX Runtime custom op ai.specdec.cpu::SwiGLU, registered with Q4Gemm (ort_q4gemm.c):
 *
 *   SwiGLU(x float [..., 2 * I]) -> float [..., I] = silu(x[..., :I]) * x[..., I:]
 *
 * An MLP gate from a gate|up projection the GEMM ops do not take (a float MatMul, a MatMulNBits) in one node, where the ONNX
 * graph has four (Split, Sigmoid and two Muls, which ONNX Runtime fuses to three; on a small model each node's overhead
 * costs as much as its arithmetic). The arithmetic is Q4Gemm's swiglu
 * epilogue (swiglu.c): every kernel gives the same bits, and a row's bits never depend on the rows beside it. The work
 * goes to ONNX Runtime's intra-op threads in blocks of rows and columns. */
#include <limits.h>
#include <stdint.h>

#include "ort_abi.h"
#include "q4_kernels.h"

enum { BLOCK_COLUMNS = 1024 }; /* a task's columns (a multiple of 8: the AVX2 loop's); a one-token step's I splits into a few */

typedef struct {
  const float* x;
  float* y;
  int64_t rows, width; /* y's width I; x's rows are 2 * I */
  int64_t column_blocks;
} SwigluTask;

static void run_swiglu(void* data, size_t i) {
  const SwigluTask* t = data;
  const int64_t r = (int64_t)i / t->column_blocks, c0 = (int64_t)i % t->column_blocks * BLOCK_COLUMNS;
  const int64_t c1 = c0 + BLOCK_COLUMNS < t->width ? c0 + BLOCK_COLUMNS : t->width;
  const float* row = t->x + r * 2 * t->width;
  swiglu_rows(row, row + t->width, (int)(2 * t->width), t->y + r * t->width, (int)t->width, 1, (int)c0, (int)c1);
}

static OrtStatus* create_swiglu(const OrtCustomOp* op, const OrtApi* a, const OrtKernelInfo* info, void** out) {
  (void)op, (void)a, (void)info;
  static int stateless;
  *out = &stateless; /* no attributes, no state */
  return NULL;
}

static void destroy_swiglu(void* kernel) { (void)kernel; }

static OrtStatus* compute_swiglu(void* kernel, OrtKernelContext* ctx) {
  (void)kernel;
  const OrtValue* in;
  OrtStatus* st;
  if ((st = CALL(KernelContext_GetInput_t, KernelContext_GetInput, ctx, 0, &in))) return st;
  OrtTensorTypeAndShapeInfo* info;
  if ((st = CALL(GetTensorTypeAndShape_t, GetTensorTypeAndShape, in, &info))) return st;
  int64_t dims[8];
  size_t n;
  st = CALL(GetDimensionsCount_t, GetDimensionsCount, info, &n);
  if (!st && (n < 1 || n > 8)) st = ort_fail(ERR_INVALID_ARGUMENT, "SwiGLU: x must have 1 to 8 dimensions");
  if (!st) st = CALL(GetDimensions_t, GetDimensions, info, dims, n);
  CALL(ReleaseTensorTypeAndShapeInfo_t, ReleaseTensorTypeAndShapeInfo, info);
  if (st) return st;
  if (dims[n - 1] % 2 || dims[n - 1] / 2 > INT_MAX / 2)
    return ort_fail(ERR_INVALID_ARGUMENT, "SwiGLU: x's last dimension must be even (gate | up), at most 2^31 - 2");
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < n; d++) rows *= dims[d];
  const int64_t width = dims[n - 1] / 2;
  dims[n - 1] = width;
  OrtValue* out;
  float *x, *y;
  if ((st = CALL(KernelContext_GetOutput_t, KernelContext_GetOutput, ctx, 0, dims, n, &out))) return st;
  if ((st = CALL(GetTensorMutableData_t, GetTensorMutableData, out, (void**)&y))) return st;
  if ((st = CALL(GetTensorMutableData_t, GetTensorMutableData, (OrtValue*)in, (void**)&x))) return st;
  if (rows == 0 || width == 0) return NULL;
  const SwigluTask task = {x, y, rows, width, (width + BLOCK_COLUMNS - 1) / BLOCK_COLUMNS};
  return CALL(KernelContext_ParallelFor_t, KernelContext_ParallelFor, ctx, run_swiglu, (size_t)(rows * task.column_blocks), 0, (void*)&task);
}

static const char* swiglu_name(const OrtCustomOp* op) { (void)op; return "SwiGLU"; }
OrtCustomOp swiglu_op = {
    OP_COMMON_FIELDS, .GetName = swiglu_name, .GetInputType = op_float_type, .GetInputTypeCount = op_one_output,
    .GetOutputType = op_float_type, .GetOutputTypeCount = op_one_output, .GetInputCharacteristic = op_required,
    .GetOutputCharacteristic = op_required, .CreateKernelV2 = create_swiglu, .KernelComputeV2 = compute_swiglu,
    .KernelDestroy = destroy_swiglu,
};
