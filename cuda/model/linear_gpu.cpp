// GpuLinear (linear_gpu.h): cuBLAS host calls; the bias and the BF16 splits are kernels
// (model_ops.h add_bias_gpu, split_bf16_gpu; bf16_split.h split_bf16x3_gpu).
#include "model/linear_gpu.h"

#include <algorithm>
#include <climits>
#include <stdexcept>

#include <fmt/format.h>

#include "model/bf16_split.h"
#include "model/model_ops.h"
#include "model/cublas_api.h"

namespace replayssm::cuda {
namespace {

void check_cublas(cublasStatus_t s, const char* call) {
  if (s != CUBLAS_STATUS_SUCCESS)
    throw std::runtime_error(fmt::format("{} failed: {} ({})", call, cublas_api().status_name(s), cublas_api().status_string(s)));
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

thread_local GemmTally* current_tally = nullptr;

// One timed interval of the installed tally (if any) around an apply's work.
class TallyInterval {
 public:
  TallyInterval(cudaStream_t stream, double flops, double tensor_flops) : tally_(current_tally), stream_(stream) {
    if (!tally_) return;
    tally_->flops += flops;
    tally_->tensor_flops += tensor_flops;
    ++tally_->calls;
    if (tally_->intervals) id_ = tally_->intervals->begin(tally_->category, stream);
  }
  void finish() {
    if (id_ >= 0) tally_->intervals->end(id_, stream_);
    id_ = -1;
  }

 private:
  GemmTally* tally_;
  cudaStream_t stream_;
  int id_ = -1;
};

}  // namespace

ScopedGemmTally::ScopedGemmTally(GemmTally* tally) : previous_(current_tally) { current_tally = tally; }
ScopedGemmTally::~ScopedGemmTally() { current_tally = previous_; }

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
  // The three parts of the weight, made on the device from the float32 values by the same split as
  // the activations'; W2 and W3 are kept only when some weight is not a BF16 value.
  auto parts = std::make_shared<Bf16Parts>();
  const std::size_t n = weight_.size();
  parts->w1.resize(n);
  parts->w2.resize(n);
  parts->w3.resize(n);
  DeviceBuffer<int> not_bf16(1);
  REPLAYSSM_CUDA_CHECK(cudaMemset(not_bf16.data(), 0, sizeof(int)));
  split_bf16x3_gpu(weight(), parts->w1.data(), parts->w2.data(), parts->w3.data(), not_bf16.data(), nullptr);
  int inexact = 0;
  not_bf16.download(&inexact, 1);  // synchronous: the split is done
  if (!inexact) {
    parts->w2 = DeviceBuffer<__nv_bfloat16>();
    parts->w3 = DeviceBuffer<__nv_bfloat16>();
  }
  bf16_ = std::move(parts);
}

bool GpuLinear::weight_is_bf16() const {
  if (!bf16_) make_bf16_parts();
  return bf16_->w2.size() == 0;
}

int64_t GpuLinear::weight_bytes() const {
  int64_t b = static_cast<int64_t>(weight_.bytes() + bias_.bytes());
  if (bf16_) b += static_cast<int64_t>(bf16_->w1.bytes() + bf16_->w2.bytes() + bf16_->w3.bytes());
  return b;
}

int64_t GpuLinear::scratch_bytes(int64_t rows, GemmPrecision precision) const {
  if (precision == GemmPrecision::fp32) return 0;
  const int64_t parts = precision == GemmPrecision::bf16x3 ? 3 : 1;
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
  check_cublas(cublas_api().set_stream(ctx.cublas, ctx.stream), "cublasSetStream");
  const int m = out_, k = in_;
  const float one = 1.0f, zero = 0.0f;
  if (ctx.gemm == GemmPrecision::fp32) {
    cublasMath_t mode;
    check_cublas(cublas_api().get_math_mode(ctx.cublas, &mode), "cublasGetMathMode");
    const int base = static_cast<int>(mode) & 0xf;
    if (base != CUBLAS_DEFAULT_MATH && base != CUBLAS_PEDANTIC_MATH)
      throw std::logic_error(fmt::format("GpuLinear::apply: the cuBLAS handle is in math mode {} (expected "
                                         "CUBLAS_DEFAULT_MATH or CUBLAS_PEDANTIC_MATH: TF32 or emulated FP32 "
                                         "would change the reference products)",
                                         static_cast<int>(mode)));
  }
  const double flops = 2.0 * static_cast<double>(x.rows) * in_ * out_;
  if (ctx.gemm != GemmPrecision::fp32 && !bf16_) make_bf16_parts();  // before the interval: not a GEMM's time
  const double products = ctx.gemm == GemmPrecision::fp32  ? 0.0
                          : ctx.gemm == GemmPrecision::bf16 ? 1.0
                          : bf16_->w2.size()                ? 6.0
                                                            : 3.0;
  TallyInterval interval(ctx.stream, flops, products * flops);
  if (in_ == 0) {
    REPLAYSSM_CUDA_CHECK(cudaMemset2DAsync(y.data, static_cast<std::size_t>(y.ld) * 4, 0,
                                           static_cast<std::size_t>(y.cols) * 4, static_cast<std::size_t>(y.rows),
                                           ctx.stream));
  } else if (ctx.gemm == GemmPrecision::fp32) {
    // Row-major y = x W^T is column-major y^T (out x rows) = W (op T of the column-major in x out) x^T.
    check_cublas(cublas_api().sgemm(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, as_int(x.rows, "rows"), k, &one,
                             weight_.data(), k, x.data, as_int(x.ld, "x.ld"), &zero, y.data, as_int(y.ld, "y.ld")),
                 "cublasSgemm");
  } else {
    const bool three = ctx.gemm == GemmPrecision::bf16x3;
    const int64_t block = std::min(x.rows, kSplitRows);
    const std::size_t part = static_cast<std::size_t>(block * in_);
    StreamScratch<__nv_bfloat16> x1(part, ctx.stream), x2(three ? part : 0, ctx.stream),
        x3(three ? part : 0, ctx.stream);
    auto gemm = [&](const DeviceBuffer<__nv_bfloat16>& w, const __nv_bfloat16* xp, int rows, float* out,
                    const float* beta) {
      check_cublas(cublas_api().gemm_ex(ctx.cublas, CUBLAS_OP_T, CUBLAS_OP_N, m, rows, k, &one, w.data(), CUDA_R_16BF, k, xp,
                                CUDA_R_16BF, k, beta, out, CUDA_R_32F, as_int(y.ld, "y.ld"), CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT),
                   "cublasGemmEx");
    };
    const Bf16Parts& w = *bf16_;
    for (int64_t r0 = 0; r0 < x.rows; r0 += block) {
      const int64_t rows = std::min(block, x.rows - r0);
      const ConstDeviceMatrix xb = x.middle_rows(r0, rows);
      float* out = y.data + r0 * y.ld;
      const int r = as_int(rows, "rows");
      if (!three) {
        split_bf16_gpu(xb, x1.get(), nullptr, ctx.stream);
        gemm(w.w1, x1.get(), r, out, &zero);
        continue;
      }
      split_bf16x3_gpu(xb, x1.get(), x2.get(), x3.get(), nullptr, ctx.stream);
      // Smallest terms first, so the large ones are added last (linear_gpu.h).
      if (w.w2.size() == 0) {
        gemm(w.w1, x3.get(), r, out, &zero);
        gemm(w.w1, x2.get(), r, out, &one);
        gemm(w.w1, x1.get(), r, out, &one);
      } else {
        gemm(w.w3, x1.get(), r, out, &zero);  // u^2 terms
        gemm(w.w2, x2.get(), r, out, &one);
        gemm(w.w1, x3.get(), r, out, &one);
        gemm(w.w2, x1.get(), r, out, &one);  // u terms
        gemm(w.w1, x2.get(), r, out, &one);
        gemm(w.w1, x1.get(), r, out, &one);
      }
    }
  }
  if (bias_.size()) add_bias_gpu(y, bias_, ctx.stream);
  interval.finish();
}

}  // namespace replayssm::cuda
