// GpuLinear (linear_gpu.h): cuBLAS host calls; the bias and the BF16 splits are model_ops kernels.
#include "model/linear_gpu.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "model/model_ops.h"

namespace replayssm::cuda {
namespace {

void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("{} failed: {} ({})", call, cublasGetStatusName(s), cublasGetStatusString(s)));
}

int as_int(int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw std::invalid_argument(fmt::format("GpuLinear: {} = {} exceeds cuBLAS's int", what, v));
  return static_cast<int>(v);
}

// Device memory from the stream-ordered pool, freed in stream order when it goes out of scope.
template <class T>
class StreamScratch {
 public:
  StreamScratch(std::size_t count, cudaStream_t stream) : stream_(stream) {
    if (count) REPLAYSSM_CUDA_CHECK(cudaMallocAsync(reinterpret_cast<void**>(&ptr_), count * sizeof(T), stream));
  }
  ~StreamScratch() {
    if (ptr_) cudaFreeAsync(ptr_, stream_);  // no check: a destructor must not throw
  }
  StreamScratch(const StreamScratch&) = delete;
  StreamScratch& operator=(const StreamScratch&) = delete;
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace

GpuLinear::GpuLinear(const model::Linear& cpu, GemmPrecision precision) : GpuLinear(cpu.weight, cpu.bias, precision) {}

GpuLinear::GpuLinear(const model::Mat& weight, const model::Vec& bias, GemmPrecision precision)
    : in_(static_cast<int>(weight.cols())), out_(static_cast<int>(weight.rows())) {
  if (bias.size() != 0 && bias.size() != weight.rows())
    throw std::invalid_argument(
        fmt::format("GpuLinear: bias has {} entries, expected none or {} (out features)", bias.size(), weight.rows()));
  weight_.upload(weight.data(), static_cast<std::size_t>(weight.size()));
  if (bias.size()) bias_.upload(bias.data(), static_cast<std::size_t>(bias.size()));
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());  // the host arrays may go away after the constructor
  if (precision != GemmPrecision::fp32) make_bf16_parts();
}

void GpuLinear::make_bf16_parts() const {
  auto parts = std::make_shared<Bf16Parts>();
  const std::size_t n = weight_.size();
  // The weight's parts are made once on the host from the float32 values (round-to-nearest-even,
  // the same conversion as split_bf16_gpu), and W_lo is kept only when some weight is not a BF16 value.
  const std::vector<float> w = weight_.to_host();
  std::vector<__nv_bfloat16> hi(n), lo(n);
  bool exact = true;
  for (std::size_t i = 0; i < n; ++i) {
    hi[i] = __float2bfloat16_rn(w[i]);
    const float rest = w[i] - __bfloat162float(hi[i]);
    lo[i] = __float2bfloat16_rn(rest);
    exact = exact && rest == 0.0f;
  }
  parts->hi.upload(hi);
  if (!exact) parts->lo.upload(lo);
  REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
  bf16_ = std::move(parts);
}

int64_t GpuLinear::weight_bytes() const {
  int64_t b = static_cast<int64_t>(weight_.bytes() + bias_.bytes());
  if (bf16_) b += static_cast<int64_t>(bf16_->hi.bytes() + bf16_->lo.bytes());
  return b;
}

int64_t GpuLinear::scratch_bytes(int64_t rows, GemmPrecision precision) const {
  if (precision == GemmPrecision::fp32) return 0;
  const int64_t parts = precision == GemmPrecision::bf16x3 ? 2 : 1;
  return parts * std::min(rows, kSplitRows) * in_ * static_cast<int64_t>(sizeof(__nv_bfloat16));
}

void GpuLinear::apply(ConstDeviceMatrix x, DeviceMatrix y, const GpuContext& ctx) const {
  if (x.cols != in_ || y.cols != out_ || y.rows != x.rows)
    throw std::invalid_argument(fmt::format("GpuLinear::apply: x is {} x {}, y {} x {}; expected rows x {} and rows x {}",
                                            x.rows, x.cols, y.rows, y.cols, in_, out_));
  if (x.ld < x.cols || y.ld < y.cols)
    throw std::invalid_argument(fmt::format("GpuLinear::apply: leading dimensions {} and {} below the widths {} and {}",
                                            x.ld, y.ld, x.cols, y.cols));
  if (!ctx.cublas) throw std::invalid_argument("GpuLinear::apply: the context has no cuBLAS handle");
  if (x.rows == 0 || out_ == 0) return;
  check_cublas(cublasSetStream(ctx.cublas, ctx.stream), "cublasSetStream");
  const int m = out_, k = in_;
  const float one = 1.0f, zero = 0.0f;
  if (in_ == 0) {
    REPLAYSSM_CUDA_CHECK(cudaMemset2DAsync(y.data, static_cast<std::size_t>(y.ld) * 4, 0,
                                           static_cast<std::size_t>(y.cols) * 4, static_cast<std::size_t>(y.rows),
                                           ctx.stream));
  } else if (ctx.gemm == GemmPrecision::fp32) {
    cublasMath_t mode;
    check_cublas(cublasGetMathMode(ctx.cublas, &mode), "cublasGetMathMode");
    const int base = static_cast<int>(mode) & 0xf;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH)
      throw std::logic_error(fmt::format("GpuLinear::apply: the cuBLAS handle is in math mode {} (expected "
                                         "CUBLAS_DEFAULT_MATH or CUBLAS_PEDANTIC_MATH: TF32 or emulated FP32 "
                                         "would change the reference products)",
                                         static_cast<int>(mode)));
    // Row-major y = x W^T is column-major y^T (out x rows) = W (op T of the column-major in x out) x^T.
    check_cublas(cublasSgemm(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, as_int(x.rows, "rows"), k, &one,
                             weight_.data(), k, x.data, as_int(x.ld, "x.ld"), &zero, y.data, as_int(y.ld, "y.ld")),
                 "cublasSgemm");
  } else {
    if (!bf16_) make_bf16_parts();
    const bool three = ctx.gemm == GemmPrecision::bf16x3;
    const int64_t block = std::min(x.rows, kSplitRows);
    StreamScratch<__nv_bfloat16> x_hi(static_cast<std::size_t>(block * in_), ctx.stream);
    StreamScratch<__nv_bfloat16> x_lo(three ? static_cast<std::size_t>(block * in_) : 0, ctx.stream);
    auto gemm = [&](const __nv_bfloat16* w, const __nv_bfloat16* xp, int rows, float* out, const float* beta) {
      check_cublas(cublasGemmEx(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, rows, k, &one, w, CUDA_R_16BF, k, xp,
                                CUDA_R_16BF, k, beta, out, CUDA_R_32F, as_int(y.ld, "y.ld"), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    };
    for (int64_t r0 = 0; r0 < x.rows; r0 += block) {
      const int64_t rows = std::min(block, x.rows - r0);
      split_bf16_gpu(x.middle_rows(r0, rows), x_hi.get(), three ? x_lo.get() : nullptr, ctx.stream);
      float* out = y.data + r0 * y.ld;
      const int r = as_int(rows, "rows");
      if (!three) {
        gemm(bf16_->hi.data(), x_hi.get(), r, out, &zero);
        continue;
      }
      // Smallest terms first, so the large one is added last.
      gemm(bf16_->hi.data(), x_lo.get(), r, out, &zero);
      if (bf16_->lo.size()) gemm(bf16_->lo.data(), x_hi.get(), r, out, &one);
      gemm(bf16_->hi.data(), x_hi.get(), r, out, &one);
    }
  }
  if (bias_.size()) add_bias_gpu(y, bias_, ctx.stream);
}

}  // namespace replayssm::cuda
