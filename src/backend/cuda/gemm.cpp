#include "backend/cuda/gemm.h"

#include <cublasLt.h>
#include <dlfcn.h>

#include <cstdint>
#include <utility>

#include "base/error.h"
#include "base/log.h"

namespace kestrel::cuda {

// The cuBLASLt entry points used, resolved from the shared library (types from the header, nothing linked).
struct Gemm::Api {
  decltype(&cublasLtCreate) create;
  decltype(&cublasLtDestroy) destroy;
  decltype(&cublasLtGetStatusString) status_string;
  decltype(&cublasLtMatmulDescCreate) desc_create;
  decltype(&cublasLtMatmulDescDestroy) desc_destroy;
  decltype(&cublasLtMatmulDescSetAttribute) desc_set;
  decltype(&cublasLtMatrixLayoutCreate) layout_create;
  decltype(&cublasLtMatrixLayoutDestroy) layout_destroy;
  decltype(&cublasLtMatrixLayoutSetAttribute) layout_set;
  decltype(&cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) preference_set;
  decltype(&cublasLtMatmulAlgoGetHeuristic) heuristic;
  decltype(&cublasLtMatmul) matmul;
};

namespace {

constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Plans kept at most: one per distinct token count and shape, and per-expert groups take every count up to a chunk's
// worth, so the cache must hold them all (about 1 KB each) or a prefill keeps paying the heuristic (an 8k prompt's
// first prefill spent ~0.1 s choosing algorithms for new counts, H100 runs 15 and 18).
constexpr size_t kMaxPlans = 16384;

template <typename Fn>
bool resolve(void* library, const char* name, Fn& fn) {
  fn = reinterpret_cast<Fn>(dlsym(library, name));
  return fn != nullptr;
}

// Loaded once per process; null when the library or one of its symbols is missing.
const Gemm::Api* load_api() {
  static const Gemm::Api* const api = []() -> const Gemm::Api* {
    // The loader's search path first, then the CUDA toolkit's default place (often not in ld.so.cache).
    void* library = dlopen("libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) library = dlopen("/usr/local/cuda/lib64/libcublasLt.so.13", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      log_warn("cuBLASLt not loaded ({}): prefill-sized linears run on the GEMV kernels", dlerror());
      return nullptr;
    }
    static Gemm::Api loaded;
    const bool all = resolve(library, "cublasLtCreate", loaded.create) &&
                     resolve(library, "cublasLtDestroy", loaded.destroy) &&
                     resolve(library, "cublasLtGetStatusString", loaded.status_string) &&
                     resolve(library, "cublasLtMatmulDescCreate", loaded.desc_create) &&
                     resolve(library, "cublasLtMatmulDescDestroy", loaded.desc_destroy) &&
                     resolve(library, "cublasLtMatmulDescSetAttribute", loaded.desc_set) &&
                     resolve(library, "cublasLtMatrixLayoutCreate", loaded.layout_create) &&
                     resolve(library, "cublasLtMatrixLayoutDestroy", loaded.layout_destroy) &&
                     resolve(library, "cublasLtMatrixLayoutSetAttribute", loaded.layout_set) &&
                     resolve(library, "cublasLtMatmulPreferenceCreate", loaded.preference_create) &&
                     resolve(library, "cublasLtMatmulPreferenceDestroy", loaded.preference_destroy) &&
                     resolve(library, "cublasLtMatmulPreferenceSetAttribute", loaded.preference_set) &&
                     resolve(library, "cublasLtMatmulAlgoGetHeuristic", loaded.heuristic) &&
                     resolve(library, "cublasLtMatmul", loaded.matmul);
    if (!all) {
      log_warn("libcublasLt.so.13 lacks a symbol this build uses: prefill-sized linears run on the GEMV kernels");
      return nullptr;
    }
    return &loaded;
  }();
  return api;
}

}  // namespace

// One shape's descriptors (operation, A = weights, B = inputs, D = outputs, column-major as cuBLASLt sees them) and
// the algorithm the heuristic chose for it.
struct Gemm::Plan {
  const Api* api = nullptr;
  cublasLtMatmulDesc_t operation = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};

  ~Plan() {
    if (d) api->layout_destroy(d);
    if (b) api->layout_destroy(b);
    if (a) api->layout_destroy(a);
    if (operation) api->desc_destroy(operation);
  }
};

namespace {

void check_blas(const Gemm::Api& api, cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS) fail("cuBLASLt {}: {}", what, api.status_string(status));
}

}  // namespace

Gemm::Gemm() : api_(load_api()) {}

Gemm::~Gemm() {
  plans_.clear();
  if (handle_) api_->destroy(static_cast<cublasLtHandle_t>(handle_));
}

void Gemm::run(GemmInput input, const void* x, int64_t num_tokens, int64_t k, const void* w, GemmWeights layout,
               int64_t n, float* y, cudaStream_t stream, bool accumulate) {
  const GemmBatch one{.x_ld = k, .y_ld = n};
  matmul(input, x, num_tokens, k, w, layout, n, y, one, accumulate ? 1.0f : 0.0f, stream);
}

void Gemm::run_batched(GemmInput input, const void* x, int64_t num_tokens, int64_t k, const void* w,
                       GemmWeights layout, int64_t n, void* y, const GemmBatch& batch, cudaStream_t stream) {
  require(batch.count >= 1 && batch.count <= INT32_MAX && batch.x_ld >= k && batch.y_ld >= n,
          "a batched product needs a positive count and rows at least as wide as its shape");
  matmul(input, x, num_tokens, k, w, layout, n, y, batch, 0.0f, stream);
}

void Gemm::matmul(GemmInput input, const void* x, int64_t num_tokens, int64_t k, const void* w, GemmWeights layout,
                  int64_t n, void* y, const GemmBatch& batch, float beta, cudaStream_t stream) {
  require(available(), "cuBLASLt is not loaded");
  if (num_tokens == 0 || n == 0) return;
  if (handle_ == nullptr) {  // made on first use: the backend owning this object may not have set its device yet
    cublasLtHandle_t handle = nullptr;
    check_blas(*api_, api_->create(&handle), "create");
    handle_ = handle;
    workspace_ = DeviceBuffer(kWorkspaceBytes);
  }
  if (plans_.size() >= kMaxPlans) plans_.clear();
  std::unique_ptr<Plan>& plan = plans_[Shape{input, layout, num_tokens, k, n, batch}];
  if (!plan) {
    // D[n, T] = op(A) · B, column-major: y row-major [T, n] (rows y_ld apart); x row-major [T, k] is B [k, T]; W [n, k]
    // row-major is A [k, n] taken transposed, Ŵ [k, n] row-major is A [n, k] as it is.
    auto built = std::make_unique<Plan>();
    built->api = api_;
    const cudaDataType_t type = input == GemmInput::bf16 ? CUDA_R_16BF : CUDA_R_16F;
    check_blas(*api_, api_->desc_create(&built->operation, CUBLAS_COMPUTE_32F, CUDA_R_32F), "matmul descriptor");
    const cublasOperation_t transpose_a = layout == GemmWeights::rows_are_outputs ? CUBLAS_OP_T : CUBLAS_OP_N;
    check_blas(*api_, api_->desc_set(built->operation, CUBLASLT_MATMUL_DESC_TRANSA, &transpose_a, sizeof(transpose_a)),
               "transpose attribute");
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    if (layout == GemmWeights::rows_are_outputs) {
      check_blas(*api_, api_->layout_create(&built->a, type, u(k), u(n), k), "weight layout");
    } else {
      check_blas(*api_, api_->layout_create(&built->a, type, u(n), u(k), n), "weight layout");
    }
    check_blas(*api_, api_->layout_create(&built->b, type, u(k), u(num_tokens), batch.x_ld), "input layout");
    check_blas(*api_,
               api_->layout_create(&built->d, batch.y_f16 ? CUDA_R_16F : CUDA_R_32F, u(n), u(num_tokens), batch.y_ld),
               "output layout");
    if (batch.count > 1) {
      const auto count = static_cast<int32_t>(batch.count);
      const std::pair<cublasLtMatrixLayout_t, int64_t> strides[] = {
          {built->a, batch.w_stride}, {built->b, batch.x_stride}, {built->d, batch.y_stride}};
      for (const auto& [matrix, stride] : strides) {
        check_blas(*api_, api_->layout_set(matrix, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
                   "batch count");
        check_blas(*api_,
                   api_->layout_set(matrix, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)),
                   "batch stride");
      }
    }
    cublasLtMatmulPreference_t preference = nullptr;
    check_blas(*api_, api_->preference_create(&preference), "preference");
    const size_t workspace = workspace_.size();
    cublasStatus_t status = api_->preference_set(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                 sizeof(workspace));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    if (status == CUBLAS_STATUS_SUCCESS) {
      status = api_->heuristic(static_cast<cublasLtHandle_t>(handle_), built->operation, built->a, built->b, built->d,
                               built->d, preference, 1, &result, &found);
    }
    api_->preference_destroy(preference);
    check_blas(*api_, status, "algorithm heuristic");
    require(found > 0, "cuBLASLt has no algorithm for a {} x {} x {} product", num_tokens, k, n);
    built->algo = result.algo;
    plan = std::move(built);
  }
  const float alpha = batch.alpha;
  check_blas(*api_,
             api_->matmul(static_cast<cublasLtHandle_t>(handle_), plan->operation, &alpha, w, plan->a, x, plan->b,
                          &beta, y, plan->d, y, plan->d, &plan->algo, workspace_.data(), workspace_.size(), stream),
             "matmul");
}

}  // namespace kestrel::cuda
