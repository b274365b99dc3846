// Decode-kernel benchmark: checks each kernel once on fresh random data, then times it with CUDA
// events (warm-up, median of repeats) and reports bytes moved, GB/s, the share of the device-to-
// device copy bandwidth measured in the same run, and the speed-up over the conventional kernel
// measured in the same run. States are larger than the L2 cache for B >= 32; for small B the state
// buffers rotate among copies between timed samples, so that a sample starts from DRAM, not L2 (the
// staggered row's sample is a window of L steps on one copy, as a serving loop re-reads its checkpoints).
#include "bench/decode_bench.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <iterator>
#include <limits>
#include <memory>
#include <regex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
// NVTX ships with the CUDA toolkit (header-only since NVTX 3); a toolkit installed without it builds a bench
// without row ranges, which says so in its header.
#if __has_include(<nvtx3/nvToolsExt.h>)
#include <nvtx3/nvToolsExt.h>
#define REPLAYSSM_BENCH_NVTX 1
#else
#define REPLAYSSM_BENCH_NVTX 0
#endif

#include "bench/bench_fill.h"
#include "cuda_check.h"
#include "io/atomic_file.h"
#include "io/csv.h"
#include "ssm/conventional_decode.h"
#include "ssm/decode_kernels.h"
#include "ssm/model_shapes.h"
#include "ssm/prior_schemes.h"
#include "ssm/replay_decode.h"

namespace replayssm::cuda {
namespace {

using formats::StorageFormat;

// Every configuration's buffers are carved from one device allocation made at the start, from its
// beginning: each row of the table runs in the same physical memory. Measured on the H200: the
// in-place conventional kernel (Nemotron-3-Super, B = 256) took 548.7 us in memory allocated first
// and 602 us after other configurations' buffers had been allocated and freed; the read-only
// replay kernels did not move. One arena makes that placement the same for every row.
class DeviceArena {
 public:
  explicit DeviceArena(std::size_t bytes) : size_(bytes) { REPLAYSSM_CUDA_CHECK(cudaMalloc(&base_, bytes)); }
  ~DeviceArena() { cudaFree(base_); }
  DeviceArena(const DeviceArena&) = delete;
  void* take(std::size_t bytes) {
    const std::size_t at = (used_ + 255) / 256 * 256;
    if (at + bytes > size_)
      throw std::runtime_error(fmt::format("bench: device arena exhausted ({} bytes needed at offset {} of {})", bytes, at, size_));
    used_ = at + bytes;
    return base_ + at;
  }
  void reset() { used_ = 0; }
  static DeviceArena*& current() {
    static DeviceArena* arena = nullptr;
    return arena;
  }

 private:
  uint8_t* base_ = nullptr;
  std::size_t size_ = 0, used_ = 0;
};

template <class T>
struct Buffer {
  T* ptr = nullptr;
  std::size_t n = 0;
  bool owned = false;
  explicit Buffer(std::size_t count) : n(count) {
    const std::size_t bytes = std::max<std::size_t>(count, 1) * sizeof(T);
    if (DeviceArena* arena = DeviceArena::current()) {
      ptr = static_cast<T*>(arena->take(bytes));
    } else {
      REPLAYSSM_CUDA_CHECK(cudaMalloc(&ptr, bytes));
      owned = true;
    }
  }
  ~Buffer() {
    if (owned) cudaFree(ptr);
  }
  Buffer(const Buffer&) = delete;
};

struct Events {
  cudaEvent_t a, b;
  Events() {
    REPLAYSSM_CUDA_CHECK(cudaEventCreate(&a));
    REPLAYSSM_CUDA_CHECK(cudaEventCreate(&b));
  }
  ~Events() {
    cudaEventDestroy(a);
    cudaEventDestroy(b);
  }
};

double median(std::vector<double> v) {
  if (v.empty()) throw std::logic_error("bench: median of no timed repetitions");  // check_bench_options refuses repeats < 1
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// BenchOptions::Timer::queued: before each sample's first event the stream gets the hold kernel
// (bench_fill.h), which spins until the host has queued the sample's work and its closing event. The
// events then bracket the GPU's work alone, as the peers' CUDA-graph timer does (replayssm_py/
// peer_timing.py); under Timer::events a one-step sample also counted the host's launch calls, several
// microseconds that mattered at small B. A hold that ends by its timeout means the host blocked in the
// timed region (a synchronous call there): the sample would be wrong, so the bench stops.
class QueuedTimer {
 public:
  QueuedTimer() {
    REPLAYSSM_CUDA_CHECK(cudaHostAlloc(&flags_, 2 * sizeof(int), cudaHostAllocMapped));
    REPLAYSSM_CUDA_CHECK(cudaHostGetDevicePointer(&device_flags_, flags_, 0));
  }
  ~QueuedTimer() { cudaFreeHost(flags_); }
  QueuedTimer(const QueuedTimer&) = delete;
  void hold() {
    release()->store(0, std::memory_order_seq_cst);
    flags_[1] = 0;
    launch_hold(device_flags_, device_flags_ + 1, kTimeoutNs);
  }
  void release_hold() { release()->store(1, std::memory_order_seq_cst); }
  void check_not_timed_out() const {  // after the sample's closing event has completed
    if (reinterpret_cast<const volatile int*>(flags_)[1] != 0)
      throw std::runtime_error(fmt::format(
          "bench: the host took longer than {} ms to queue one timed sample (a synchronous CUDA call in the timed "
          "region?); its time would include the host, so the run stops",
          kTimeoutNs / 1000000));
  }
  static QueuedTimer*& current() {  // set while run_decode_bench runs with Timer::queued
    static QueuedTimer* timer = nullptr;
    return timer;
  }

 private:
  static constexpr uint64_t kTimeoutNs = 200'000'000;
  std::atomic<int>* release() { return reinterpret_cast<std::atomic<int>*>(flags_); }
  int* flags_ = nullptr;  // [0]: release, [1]: timed out
  int* device_flags_ = nullptr;
};

// Median time in microseconds of `timed`, with `prepare` run before each repetition outside the
// timed region.
double time_us(int repeats, const std::function<void()>& timed, const std::function<void()>& prepare = {}) {
  Events ev;
  QueuedTimer* queued = QueuedTimer::current();
  std::vector<double> samples;
  for (int i = 0; i < repeats + 3; ++i) {
    if (prepare) prepare();
    // The first warm-up sample runs without the hold: a kernel's first launch loads its module (CUDA's lazy
    // loading), which waits for the device, so behind a holding kernel it blocked until the hold's timeout
    // (device run, 2026-12-06). Warm-up samples are not kept.
    const bool hold = queued && i > 0;
    if (hold) queued->hold();
    REPLAYSSM_CUDA_CHECK(cudaEventRecord(ev.a));
    timed();
    REPLAYSSM_CUDA_CHECK(cudaEventRecord(ev.b));
    if (hold) queued->release_hold();
    REPLAYSSM_CUDA_CHECK(cudaEventSynchronize(ev.b));
    if (hold) queued->check_not_timed_out();
    float ms = 0;
    REPLAYSSM_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.a, ev.b));
    if (i >= 3) samples.push_back(1000.0 * ms);
  }
  return median(samples);
}

double measure_copy_gbps(int repeats) {
  const std::size_t bytes = std::size_t{2} << 30;
  Buffer<uint8_t> src(bytes), dst(bytes);
  REPLAYSSM_CUDA_CHECK(cudaMemset(src.ptr, 1, bytes));
  const double us = time_us(repeats, [&] { REPLAYSSM_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, bytes, cudaMemcpyDeviceToDevice)); });
  return 2.0 * bytes / (us * 1e-6) / 1e9;  // read + write
}

// Everything one (shape, B) configuration needs on the device.
struct Workspace {
  DecodeShape s;
  ssm::Recurrence kind;
  int copies;  // rotating state copies (small batches)
  std::size_t state_elems;
  std::unique_ptr<Buffer<float>> state;        // copies x fp32 states
  std::unique_ptr<Buffer<uint8_t>> lowp_payload;  // low-precision states (largest format: fp16)
  std::unique_ptr<Buffer<uint8_t>> lowp_codes;
  std::unique_ptr<Buffer<float>> lowp_scales, lowp_tensor;
  std::unique_ptr<Buffer<float>> residual;        // error feedback (+ef): one copy's fp32 residual
  std::unique_ptr<Buffer<__nv_bfloat16>> q, k, v, rec_k, rec_v;
  std::unique_ptr<Buffer<float>> alpha, beta, out, rec_u, rec_a, rec_b;
  std::unique_ptr<Buffer<WindowState>> win0, win1;
  std::unique_ptr<Buffer<int>> accepted;
  int capacity;

  int decay_width() const { return ssm::decay_width(kind, s.dk); }  // floats of one decay: 1, or dk (KDA)
  Workspace(ssm::Recurrence kd, const DecodeShape& shape, int max_window, int max_drafts) : s(shape), kind(kd) {
    state_elems = s.heads() * s.head_elements();
    const std::size_t state_bytes = state_elems * 4;
    copies = static_cast<int>(std::clamp<std::size_t>((std::size_t{512} << 20) / state_bytes, 1, 16));
    state = std::make_unique<Buffer<float>>(state_elems * copies);
    lowp_payload = std::make_unique<Buffer<uint8_t>>(state_elems * 2 * copies);
    lowp_codes = std::make_unique<Buffer<uint8_t>>(state_elems / 16 * copies);
    lowp_scales = std::make_unique<Buffer<float>>(state_elems / 128 * copies);
    lowp_tensor = std::make_unique<Buffer<float>>(s.heads() * copies);
    residual = std::make_unique<Buffer<float>>(state_elems);
    randomize_states();
    const std::size_t T = max_drafts;
    q = std::make_unique<Buffer<__nv_bfloat16>>(s.batch * T * s.key_heads * s.dk);
    k = std::make_unique<Buffer<__nv_bfloat16>>(q->n);
    v = std::make_unique<Buffer<__nv_bfloat16>>(s.batch * T * s.value_heads * s.dv);
    alpha = std::make_unique<Buffer<float>>(s.batch * T * s.value_heads * decay_width());
    beta = std::make_unique<Buffer<float>>(s.batch * T * s.value_heads);
    out = std::make_unique<Buffer<float>>(v->n);
    fill_inputs(kTimedInputSeed);
    capacity = std::max({max_window, 16, max_drafts}) + max_drafts;  // verification runs at L = 16
    rec_k = std::make_unique<Buffer<__nv_bfloat16>>(s.batch * capacity * s.key_heads * s.dk);
    rec_v = std::make_unique<Buffer<__nv_bfloat16>>(s.batch * capacity * s.value_heads * s.dv);
    rec_u = std::make_unique<Buffer<float>>(rec_v->n);
    rec_a = std::make_unique<Buffer<float>>(s.batch * capacity * s.value_heads * decay_width());
    rec_b = std::make_unique<Buffer<float>>(s.batch * capacity * s.value_heads);
    fill_uniform_bf16(rec_k->ptr, rec_k->n, -0.09f, 0.09f, 9);
    fill_uniform_bf16(rec_v->ptr, rec_v->n, -1.0f, 1.0f, 10);
    fill_uniform(rec_u->ptr, rec_u->n, -1.0f, 1.0f, 11);
    fill_uniform(rec_a->ptr, rec_a->n, 0.9f, 0.999f, 12);
    fill_uniform(rec_b->ptr, rec_b->n, 0.1f, 0.9f, 13);
    win0 = std::make_unique<Buffer<WindowState>>(s.batch);
    win1 = std::make_unique<Buffer<WindowState>>(s.batch);
    accepted = std::make_unique<Buffer<int>>(s.batch);
  }

  // The step inputs q, k, v, alpha, beta from seeds seed .. seed + 4. The timed runs use
  // kTimedInputSeed; the validation draws fresh ones every step (KernelCheck::run).
  static constexpr uint64_t kTimedInputSeed = 4;
  void fill_inputs(uint64_t seed) {
    fill_uniform_bf16(q->ptr, q->n, -0.09f, 0.09f, seed);  // |q|, |k| ~ unit norm at dk = 128
    fill_uniform_bf16(k->ptr, k->n, -0.09f, 0.09f, seed + 1);
    fill_uniform_bf16(v->ptr, v->n, -1.0f, 1.0f, seed + 2);
    fill_uniform(alpha->ptr, alpha->n, 0.9f, 0.999f, seed + 3);
    fill_uniform(beta->ptr, beta->n, 0.1f, 0.9f, seed + 4);
  }
  // The timed runs' states: random, never zeros (zeros can run faster than real data).
  void randomize_states() {
    fill_uniform(state->ptr, state->n, -0.5f, 0.5f, 1);
    REPLAYSSM_CUDA_CHECK(cudaMemset(lowp_payload->ptr, 0x11, lowp_payload->n));
    REPLAYSSM_CUDA_CHECK(cudaMemset(lowp_codes->ptr, 0x30, lowp_codes->n));
    fill_uniform(lowp_scales->ptr, lowp_scales->n, 1e-3f, 2e-3f, 2);
    fill_uniform(lowp_tensor->ptr, lowp_tensor->n, 1e-3f, 2e-3f, 3);
    fill_uniform(residual->ptr, residual->n, -1e-4f, 1e-4f, 5);
  }
  // The validation's start: every state zero (the CPU decoders' initial state; zero is also every
  // low-precision format's encoding of a zero state).
  void zero_states() {
    REPLAYSSM_CUDA_CHECK(cudaMemset(state->ptr, 0, state->n * sizeof(float)));
    REPLAYSSM_CUDA_CHECK(cudaMemset(lowp_payload->ptr, 0, lowp_payload->n));
    REPLAYSSM_CUDA_CHECK(cudaMemset(lowp_codes->ptr, 0, lowp_codes->n));
    REPLAYSSM_CUDA_CHECK(cudaMemset(lowp_scales->ptr, 0, lowp_scales->n * sizeof(float)));
    REPLAYSSM_CUDA_CHECK(cudaMemset(lowp_tensor->ptr, 0, lowp_tensor->n * sizeof(float)));
    REPLAYSSM_CUDA_CHECK(cudaMemset(residual->ptr, 0, residual->n * sizeof(float)));
  }
  // Appendix F: the current token's decay of value heads h with h % 4 < quarters set to `decay` (every
  // channel for KDA); 1e-9 puts their gamma below every format's skip threshold (2^-24 and up).
  void set_head_decays(int quarters, float decay, int period = 4) {
    std::vector<float> a(alpha->n);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(a.data(), alpha->ptr, a.size() * sizeof(float), cudaMemcpyDeviceToHost));
    const std::size_t width = static_cast<std::size_t>(decay_width());
    for (std::size_t i = 0; i < a.size(); ++i)
      if (static_cast<int>((i / width) % static_cast<std::size_t>(s.value_heads)) % period < quarters) a[i] = decay;
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(alpha->ptr, a.data(), a.size() * sizeof(float), cudaMemcpyHostToDevice));
  }
  StepInputs inputs() const { return {q->ptr, k->ptr, v->ptr, alpha->ptr, beta->ptr, out->ptr}; }
  DeviceState fp32_state(int copy) const {
    DeviceState d;
    d.payload = reinterpret_cast<uint8_t*>(state->ptr + state_elems * copy);
    return d;
  }
  DeviceState lowp_state(StorageFormat f, int copy) const {
    DeviceState d;
    d.format = f;
    d.payload = lowp_payload->ptr + state_elems * 2 * copy;
    d.scale_codes = f == StorageFormat::nvfp4 ? lowp_codes->ptr + state_elems / 16 * copy : nullptr;
    d.block_scales = f == StorageFormat::fp8b128 ? lowp_scales->ptr + state_elems / 128 * copy : nullptr;
    d.tensor_scales = f == StorageFormat::nvfp4 ? lowp_tensor->ptr + s.heads() * copy : nullptr;
    return d;
  }
  // drafts: the T of the verification the ring serves (0 for standard decode, whose flush then
  // stages L records, not max(L, T) + 1).
  DeviceRecords records(int drafts = 0) const {
    DeviceRecords r;
    r.capacity = capacity;
    r.max_drafts = drafts;
    r.k = rec_k->ptr, r.v = rec_v->ptr, r.u = rec_u->ptr, r.alpha = rec_a->ptr, r.beta = rec_b->ptr;
    r.window[0] = win0->ptr, r.window[1] = win1->ptr;
    return r;
  }
  // Every sequence at window position h (records [0, h) hold random data).
  void set_windows(std::function<int(int)> h_of, cudaStream_t stream = nullptr) {
    std::vector<WindowState> w(s.batch);
    for (int b = 0; b < s.batch; ++b) w[b].h = h_of(b);
    REPLAYSSM_CUDA_CHECK(cudaMemcpyAsync(win0->ptr, w.data(), w.size() * sizeof(WindowState), cudaMemcpyHostToDevice, stream));
    REPLAYSSM_CUDA_CHECK(cudaMemcpyAsync(win1->ptr, w.data(), w.size() * sizeof(WindowState), cudaMemcpyHostToDevice, stream));
  }
};

// ReplayConfig::flush_list of the bench's standard steps (BenchOptions::flush_lists): from every sequence's
// window position h_b at the start, the sequences that flush at each of the next L steps ((h_b + t) mod L =
// L - 1 with h_b < L), on the device before anything is timed. at() leaves a configuration without a list
// when the lists are off, and for GDN with a read skip threshold (the launcher refuses a list there).
class FlushSchedule {
 public:
  FlushSchedule(ssm::Recurrence kind, int batch, int L, const std::function<int(int)>& h_of, bool enabled)
      : kind_(kind), batch_(batch), L_(L), enabled_(enabled), lists_(static_cast<std::size_t>(batch) * L), counts_(L, 0) {
    std::vector<int> lists(lists_.n, -1);
    for (int t = 0; t < L; ++t)
      for (int b = 0; b < batch; ++b)
        if ((h_of(b) + t) % L == L - 1) lists[static_cast<std::size_t>(t) * batch + counts_[t]++] = b;
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(lists_.ptr, lists.data(), lists.size() * sizeof(int), cudaMemcpyHostToDevice));
  }
  // `config` for step t (0: the first step from the starting positions; counted modulo L).
  ReplayConfig at(ReplayConfig config, int t) const {
    if (!enabled_ || (kind_ == ssm::Recurrence::gdn && config.skip_threshold_read > 0.0f)) return config;
    config.flush_list = lists_.ptr + static_cast<std::size_t>(t % L_) * batch_;
    config.flush_count = counts_[t % L_];
    return config;
  }

 private:
  ssm::Recurrence kind_;
  int batch_, L_;
  bool enabled_;
  Buffer<int> lists_;
  std::vector<int> counts_;
};

// Bytes a step must move (each input read once, each output written once).
struct ByteModel {
  const DecodeShape& s;
  ssm::Recurrence kind;
  double state() const { return 4.0 * s.heads() * s.head_elements(); }
  double lowp_state(StorageFormat f) const { return static_cast<double>(s.heads()) * formats::storage_bytes(f, s.dv, s.dk); }
  double decay_bytes() const { return 4.0 * ssm::decay_width(kind, s.dk); }  // fp32 a: one, or dk of them (KDA)
  double inputs(int T = 1) const {
    return T * s.batch * (2.0 * 2 * s.key_heads * s.dk + s.value_heads * (2.0 * s.dv + decay_bytes() + 4 + 4.0 * s.dv));
  }
  // One record per head: v (bf16), a, and for GDN/KDA u (fp32) and b; the key once per key head.
  double record() const {
    return s.batch * (2.0 * s.key_heads * s.dk +
                      s.value_heads * (2.0 * s.dv + decay_bytes() + (ssm::has_delta_rule(kind) ? 4.0 * s.dv + 4 : 0)));
  }
  double conventional() const { return 2 * state() + inputs(); }
  double residual() const { return 4.0 * s.heads() * s.head_elements(); }  // an ef copy's fp32 residual
  // Non-flush step at window position h0 (h0 records read, one written) reading a checkpoint of `read` bytes.
  double nonflush(int h0, double read) const { return read + inputs() + (h0 + 1) * record(); }
  double flush(int L) const { return 2 * state() + inputs() + L * record(); }
  double window(int L, double read) const {
    double b = flush(L);
    for (int h0 = 0; h0 < L - 1; ++h0) b += nonflush(h0, read);
    return b;
  }
};

// ---- validation before timing (BenchOptions::check) ------------------------------------------------
// Each kernel the bench times runs first from zero states on fresh random inputs every step (the
// workspace's buffers refilled, then restored to the timed inputs) and its outputs for the first and the last sequence are compared with the
// CPU decoders of src/ssm (ConventionalDecoder, ReplayDecoder, SplitPrecisionReplayDecoder) with the
// tolerances of tests/cuda/test_decode_cuda.cpp: FP32 paths within 1e-5 (rms + |cpu|) everywhere;
// low-precision states within the format's tolerance (fp16 state 2e-3, bf16 2e-2, a split read 5e-3)
// except at most 0.1% of the elements, and all within one code step, 0.25 (rms + |cpu|): a last-bit
// difference of the FP32 update can flip a stored code. A mismatch stops the bench before any timing.
// Fresh tokens matter: the same token every step from a zero state makes every state rank one
// (S = c v k^T), so each row's block holds the same element-to-amax ratios and one code near a
// rounding midpoint flips in every row at once: measured on the H200 (2026-12-02), an FP8-b128
// split read on the Nemotron-3-Super shape then had 0.73% of its outputs beyond 5e-3, all within
// one code step (2.45 x 5e-3), where independent flips stay far below 0.1%.
struct HostInputs {
  int T;
  int width = 1;  // floats of one decay (KDA: dk)
  std::vector<float> q, k, v, alpha, beta;
  HostInputs(const Workspace& ws, int tokens) : T(tokens) {
    const DecodeShape& s = ws.s;
    auto bf16 = [](const __nv_bfloat16* d, std::size_t n) {
      std::vector<__nv_bfloat16> h(n);
      REPLAYSSM_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
      std::vector<float> f(n);
      for (std::size_t i = 0; i < n; ++i) f[i] = __bfloat162float(h[i]);
      return f;
    };
    auto f32 = [](const float* d, std::size_t n) {
      std::vector<float> h(n);
      REPLAYSSM_CUDA_CHECK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
      return h;
    };
    const std::size_t nk = static_cast<std::size_t>(s.batch) * T * s.key_heads * s.dk;
    const std::size_t nv = static_cast<std::size_t>(s.batch) * T * s.value_heads * s.dv;
    const std::size_t nh = static_cast<std::size_t>(s.batch) * T * s.value_heads;
    width = ws.decay_width();
    q = bf16(ws.q->ptr, nk), k = bf16(ws.k->ptr, nk), v = bf16(ws.v->ptr, nv);
    alpha = f32(ws.alpha->ptr, nh * width), beta = f32(ws.beta->ptr, nh);
  }
  // Token t of sequence b, key head g (layouts of decode_kernels.h: [B][T][G][dk], [B][T][H][dv]).
  ssm::GroupToken token(const DecodeShape& s, int b, int g, int t) const {
    ssm::GroupToken x;
    const std::size_t kh = (static_cast<std::size_t>(b) * T + t) * s.key_heads + g;
    x.q = &q[kh * s.dk];
    x.k = &k[kh * s.dk];
    const int hpg = s.value_heads / s.key_heads;
    for (int j = 0; j < hpg; ++j) {
      const std::size_t vh = (static_cast<std::size_t>(b) * T + t) * s.value_heads + g * hpg + j;
      x.alpha.push_back(&alpha[vh * width]);
      x.beta.push_back(beta[vh]);
      x.v.push_back(&v[vh * s.dv]);
    }
    return x;
  }
};

struct CheckMeter {
  std::vector<double> gpu, cpu;
  // max |gpu - cpu| / (tol (rms + |cpu|)) and the count of elements beyond tol; NaN never matches.
  std::pair<double, std::size_t> excess(double tol) const {
    double ms = 0.0;
    for (double c : cpu) ms += c * c;
    const double rms = std::sqrt(ms / std::max<std::size_t>(1, cpu.size()));
    double worst = 0.0;
    std::size_t beyond = 0;
    for (std::size_t i = 0; i < gpu.size(); ++i) {
      const double e = std::abs(gpu[i] - cpu[i]) / (tol * (rms + std::abs(cpu[i])));
      const double x = std::isfinite(e) ? e : std::numeric_limits<double>::infinity();
      worst = std::max(worst, x);
      beyond += !(x <= 1.0);
    }
    return {worst, beyond};
  }
};

class KernelCheck {
 public:
  KernelCheck(Workspace& ws, const std::string& model) : ws_(ws), model_(model) {}

  // Runs `steps` calls of `gpu_step` (T tokens each) and of `cpu_step` on sequences 0 and B - 1 and
  // compares every output; `lowp_tol` > 0 marks a low-precision state and is its format's tolerance.
  template <class GpuStep, class CpuStep>
  void run(const std::string& kernel, int T, int steps, double lowp_tol, GpuStep&& gpu_step, CpuStep&& cpu_step) {
    const DecodeShape& s = ws_.s;
    const std::vector<int> seqs = s.batch > 1 ? std::vector<int>{0, s.batch - 1} : std::vector<int>{0};
    const int hpg = s.value_heads / s.key_heads;
    CheckMeter meter;
    std::vector<float> out(ws_.out->n), ref(static_cast<std::size_t>(T) * hpg * s.dv);
    for (int step = 0; step < steps; ++step) {
      ws_.fill_inputs(kCheckInputSeed + 8 * static_cast<uint64_t>(input_draws_++));
      if (after_fill) after_fill();  // e.g. fast decays, so that a skipping configuration skips
      const HostInputs in(ws_, T);
      gpu_step();
      REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
      const std::size_t per_seq = static_cast<std::size_t>(T) * s.value_heads * s.dv;
      for (int b : seqs)  // only the checked sequences' outputs come back
        REPLAYSSM_CUDA_CHECK(cudaMemcpy(out.data() + b * per_seq, ws_.out->ptr + b * per_seq, per_seq * sizeof(float),
                                        cudaMemcpyDeviceToHost));
      for (int b : seqs)
        for (int g = 0; g < s.key_heads; ++g) {
          cpu_step(b, g, in, ref.data());
          for (int t = 0; t < T; ++t)
            for (int e = 0; e < hpg * s.dv; ++e) {
              const std::size_t at = ((static_cast<std::size_t>(b) * T + t) * s.value_heads + g * hpg) * s.dv + e;
              meter.gpu.push_back(out[at]);
              meter.cpu.push_back(ref[static_cast<std::size_t>(t) * hpg * s.dv + e]);
            }
        }
    }
    ws_.fill_inputs(Workspace::kTimedInputSeed);
    const bool low_precision = lowp_tol > 0;
    const double tol = low_precision ? lowp_tol : 1e-5;
    const auto [excess, beyond] = meter.excess(tol);
    if (low_precision)
      worst_flips_ = std::max(worst_flips_, static_cast<double>(beyond) / static_cast<double>(meter.gpu.size()));
    const bool ok = low_precision ? beyond * 1000 <= meter.gpu.size() && meter.excess(0.25).first <= 1.0 : excess <= 1.0;
    if (!low_precision) worst_fp32_ = std::max(worst_fp32_, excess);
    ++checked_;
    if (!ok)
      throw std::runtime_error(fmt::format(
          "bench: {} on {} (B = {}) differs from the CPU reference before timing: max |d| = {:.3g} x {:g} (rms + |cpu|), "
          "{} of {} elements beyond it", kernel, model_, s.batch, excess, tol, beyond, meter.gpu.size()));
  }
  std::function<void()> after_fill;  // runs after each step's inputs are drawn, before they are copied back
  int checked() const { return checked_; }
  double worst_fp32() const { return worst_fp32_; }
  double worst_flips() const { return worst_flips_; }

 private:
  static constexpr uint64_t kCheckInputSeed = 1000;
  Workspace& ws_;
  int input_draws_ = 0;
  double worst_flips_ = 0.0;  // largest fraction of a low-precision path's outputs beyond its tolerance
  std::string model_;
  double worst_fp32_ = 0.0;  // largest max |d| / (1e-5 (rms + |cpu|)) of the FP32 paths
  int checked_ = 0;
};

// Decoders of sequences 0 and B - 1 (indexed [b][g]; other sequences are not checked).
template <class Decoder>
using DecoderGrid = std::vector<std::vector<std::unique_ptr<Decoder>>>;

// BenchOptions::flush_heads_per_block as a shape's ReplayConfig takes it: the KDA kernels refuse any, so 0 there.
int flush_heads_for(ssm::Recurrence kind, int requested) { return kind == ssm::Recurrence::kda ? 0 : requested; }

void check_kernels(ssm::Recurrence kind, Workspace& ws, const ssm::ModelShape& m, const std::vector<int>& windows,
                   const std::vector<int>& drafts, int heads_per_block, int flush_heads_per_block, bool flush_lists) {
  const DecodeShape& s = ws.s;
  const ssm::HeadGroupShape group{kind, s.dk, s.dv, s.value_heads / s.key_heads};
  KernelCheck check(ws, std::string(m.short_name));
  auto id = [](int b, int g) { return ssm::HeadGroupId{static_cast<uint32_t>(b), static_cast<uint32_t>(g)}; };
  auto grid = [&](auto make) {
    using D = typename decltype(make(0, 0))::element_type;
    DecoderGrid<D> d(static_cast<std::size_t>(s.batch));
    for (int b : {0, s.batch - 1}) {
      d[static_cast<std::size_t>(b)].clear();
      for (int g = 0; g < s.key_heads; ++g) d[static_cast<std::size_t>(b)].push_back(make(b, g));
    }
    return d;
  };
  // Conventional decode, fp32 / fp16 / bf16 state.
  for (StorageFormat f : {StorageFormat::fp32, StorageFormat::fp16, StorageFormat::bf16}) {
    ws.zero_states();
    const auto policy = ssm::PrecisionPolicy::parse(f == StorageFormat::fp32 ? "conv:fp32"
                                                    : f == StorageFormat::fp16 ? "conv:fp16+rtn" : "conv:bf16+rtn");
    auto cpu = grid([&](int b, int g) { return std::make_unique<ssm::ConventionalDecoder>(group, policy, id(b, g)); });
    const DeviceState st = f == StorageFormat::fp32 ? ws.fp32_state(0) : ws.lowp_state(f, 0);
    const double lowp_tol = f == StorageFormat::fp32 ? 0.0 : f == StorageFormat::fp16 ? 2e-3 : 2e-2;
    check.run(fmt::format("conventional {}", formats::to_string(f)), 1, 4, lowp_tol,
              [&] { conventional_step(kind, s, ws.inputs(), st, nullptr); },
              [&](int b, int g, const HostInputs& in, float* ref) { cpu[b][g]->step(in.token(s, b, g, 0), ref); });
  }
  // ReplaySSM standard decode: shared FP32 and split low-precision reads, over L + 2 steps (a flush).
  for (int L : windows) {
    std::vector<StorageFormat> reads{StorageFormat::fp32, StorageFormat::fp16, StorageFormat::nvfp4};
    if (s.dk % 128 == 0) reads.push_back(StorageFormat::fp8b128);
    for (StorageFormat read : reads) {
      ws.zero_states();
      ws.set_windows([](int) { return 0; });
      const std::string text = read == StorageFormat::fp32 ? fmt::format("shared:fp32@{}", L)
                                                           : fmt::format("split:{}+rtn/fp32@{}", formats::to_string(read), L);
      const auto policy = ssm::PrecisionPolicy::parse(text);
      auto cpu = grid([&](int b, int g) { return ssm::make_decoder(group, policy, id(b, g)); });
      ReplayConfig cfg;
      cfg.window = L;
      cfg.heads_per_block = heads_per_block;
      cfg.flush_heads_per_block = flush_heads_for(kind, flush_heads_per_block);
      cfg.recur = ws.fp32_state(0);
      if (read != StorageFormat::fp32) cfg.read = ws.lowp_state(read, 0);
      DeviceRecords rec = ws.records();
      const FlushSchedule schedule(kind, s.batch, L, [](int) { return 0; }, flush_lists);
      int t = 0;
      check.run("replay " + text, 1, L + 2, read == StorageFormat::fp32 ? 0.0 : 5e-3,
                [&] { replay_step(kind, s, ws.inputs(), schedule.at(cfg, t++), rec, nullptr); },
                [&](int b, int g, const HostInputs& in, float* ref) { cpu[b][g]->step(in.token(s, b, g, 0), ref); });
    }
  }
  // Error feedback: conventional fp16+ef.
  {
    ws.zero_states();
    const auto policy = ssm::PrecisionPolicy::parse("conv:fp16+ef");
    auto cpu = grid([&](int b, int g) { return std::make_unique<ssm::ConventionalDecoder>(group, policy, id(b, g)); });
    DeviceState st = ws.lowp_state(StorageFormat::fp16, 0);
    st.residual = ws.residual->ptr;
    check.run("conventional fp16+ef", 1, 4, 2e-3,
              [&] { conventional_step(kind, s, ws.inputs(), st, nullptr, formats::Rounding::ef); },
              [&](int b, int g, const HostInputs& in, float* ref) { cpu[b][g]->step(in.token(s, b, g, 0), ref); });
  }
  // Error feedback on a split NVFP4 read copy, and appendix F skipping: even value heads decay at 0.3
  // per token, so their NVFP4 reads are skipped from the second token on and an FP32 flush after 16
  // tokens is a pure write; odd heads keep 0.9-0.999 and never skip.
  for (int L : windows) {
    for (const std::string& text : {fmt::format("split:nvfp4+ef/fp32@{}", L), fmt::format("shared:fp32@{},skip=auto", L),
                                    fmt::format("split:nvfp4/fp32@{},skip=auto", L)}) {
      ws.zero_states();
      ws.set_windows([](int) { return 0; });
      const auto policy = ssm::PrecisionPolicy::parse(text);
      const bool split = policy.scheme == ssm::DecodeScheme::split;
      auto cpu = grid([&](int b, int g) { return ssm::make_decoder(group, policy, id(b, g)); });
      ReplayConfig cfg;
      cfg.window = L;
      cfg.heads_per_block = heads_per_block;
      cfg.flush_heads_per_block = flush_heads_for(kind, flush_heads_per_block);
      cfg.recur = ws.fp32_state(0);
      if (split) cfg.read = ws.lowp_state(StorageFormat::nvfp4, 0);
      if (policy.read.rounding == formats::Rounding::ef) {
        cfg.read.residual = ws.residual->ptr;
        cfg.read_rounding = formats::Rounding::ef;
      }
      cfg.skip_threshold_read = policy.skip.threshold_for(split ? policy.read : policy.recur);
      cfg.skip_threshold_flush = policy.skip.threshold_for(policy.recur);
      if (cfg.skips()) check.after_fill = [&] { ws.set_head_decays(1, 0.3f, 2); };
      DeviceRecords rec = ws.records();
      const FlushSchedule schedule(kind, s.batch, L, [](int) { return 0; }, flush_lists);
      int t = 0;
      check.run("replay " + text, 1, L + 2, split ? 5e-3 : 0.0,
                [&] { replay_step(kind, s, ws.inputs(), schedule.at(cfg, t++), rec, nullptr); },
                [&](int b, int g, const HostInputs& in, float* ref) { cpu[b][g]->step(in.token(s, b, g, 0), ref); });
      check.after_fill = nullptr;
    }
  }
  // Verification at L = 16 with every draft accepted: h runs 0, T, 2T, ... and flushes when h + T > 16.
  for (int T : drafts) {
    ws.zero_states();
    ws.set_windows([](int) { return 0; });
    const auto policy = ssm::PrecisionPolicy::parse("shared:fp32@16");
    ssm::ReplayDecoderOptions opts;
    opts.max_draft = T;
    auto cpu = grid([&](int b, int g) { return std::make_unique<ssm::ReplayDecoder>(group, policy, id(b, g), opts); });
    ReplayConfig cfg;
    cfg.window = 16;
    cfg.recur = ws.fp32_state(0);
    DeviceRecords rec = ws.records(T);
    const std::vector<int> all(static_cast<std::size_t>(s.batch), T);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(ws.accepted->ptr, all.data(), all.size() * sizeof(int), cudaMemcpyHostToDevice));
    check.run(fmt::format("verify T={}", T), T, 16 / T + 2, 0.0,
              [&] {
                verify_step(kind, s, T, ws.inputs(), cfg, rec, nullptr);
                commit_step(s, ws.accepted->ptr, rec, nullptr);
              },
              [&](int b, int g, const HostInputs& in, float* ref) {
                std::vector<ssm::GroupToken> x;
                for (int t = 0; t < T; ++t) x.push_back(in.token(s, b, g, t));
                cpu[b][g]->verify(x, ref);
                cpu[b][g]->commit(T);
              });
  }
  // Algorithm 3: verification with an NVFP4 LP copy and an FP32 HP copy (LP reads before the flush).
  for (int T : drafts) {
    ws.zero_states();
    ws.set_windows([](int) { return 0; });
    const auto policy = ssm::PrecisionPolicy::parse("split:nvfp4+rtn/fp32@16");
    ssm::ReplayDecoderOptions opts;
    opts.max_draft = T;
    auto cpu = grid([&](int b, int g) { return std::make_unique<ssm::SplitPrecisionReplayDecoder>(group, policy, id(b, g), opts); });
    ReplayConfig cfg;
    cfg.window = 16;
    cfg.recur = ws.fp32_state(0);
    cfg.read = ws.lowp_state(StorageFormat::nvfp4, 0);
    DeviceRecords rec = ws.records(T);
    const std::vector<int> all(static_cast<std::size_t>(s.batch), T);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(ws.accepted->ptr, all.data(), all.size() * sizeof(int), cudaMemcpyHostToDevice));
    check.run(fmt::format("verify split:nvfp4/fp32 T={}", T), T, 16 / T + 2, 5e-3,
              [&] {
                verify_step(kind, s, T, ws.inputs(), cfg, rec, nullptr);
                commit_step(s, ws.accepted->ptr, rec, nullptr);
              },
              [&](int b, int g, const HostInputs& in, float* ref) {
                std::vector<ssm::GroupToken> x;
                for (int t = 0; t < T; ++t) x.push_back(in.token(s, b, g, t));
                cpu[b][g]->verify(x, ref);
                cpu[b][g]->commit(T);
              });
  }
  ws.randomize_states();
  std::printf("# %s B=%d: %d kernel configurations checked against the CPU decoders before timing (FP32 paths: "
              "max |d| = %.2f x 1e-5 (rms + |cpu|); low-precision paths: at most %.4f%% of outputs beyond their "
              "tolerance, flipped codes)\n",
              std::string(m.short_name).c_str(), s.batch, check.checked(), check.worst_fp32(), 100.0 * check.worst_flips());
}

// ---- figure 7: prior speculative state-recovery schemes (paper appendix A) --------------------
// One verify step of T drafts plus the state recovery after the verdict a (every sequence at the
// same a), for The Mamba in the Llama, Snakes and Ladders (activation replay, joint attainment) and
// STree (cuda/ssm/prior_schemes.h), beside ReplaySSM's verify_step + commit_step and the vLLM
// snapshot baseline, each normalised to one conventional FP32 step of the same run.

// The scheme buffers of one (shape, B): up to three full states, two draft caches, the verdicts.
struct SchemeWorkspace {
  std::unique_ptr<Buffer<float>> states, snaps, cache_a, cache_b;
  std::unique_ptr<Buffer<__nv_bfloat16>> cache_k, cache_v;
  std::unique_ptr<Buffer<int>> prev, accepted;
  std::size_t state_elems, nk, nv, nh;
  int max_drafts;
  SchemeWorkspace(const Workspace& ws, int max_t) : state_elems(ws.state_elems), max_drafts(max_t) {
    const DecodeShape& s = ws.s;
    nk = static_cast<std::size_t>(s.batch) * max_t * s.key_heads * s.dk;
    nv = static_cast<std::size_t>(s.batch) * max_t * s.value_heads * s.dv;
    nh = static_cast<std::size_t>(s.batch) * max_t * s.value_heads;
    states = std::make_unique<Buffer<float>>(3 * state_elems);
    snaps = std::make_unique<Buffer<float>>(static_cast<std::size_t>(max_t) * state_elems);
    cache_k = std::make_unique<Buffer<__nv_bfloat16>>(2 * nk);
    cache_v = std::make_unique<Buffer<__nv_bfloat16>>(2 * nv);
    cache_a = std::make_unique<Buffer<float>>(2 * nh);
    cache_b = std::make_unique<Buffer<float>>(2 * nh);
    prev = std::make_unique<Buffer<int>>(s.batch);
    accepted = std::make_unique<Buffer<int>>(s.batch);
    randomize();
  }
  // The timed runs' data: random, never zeros (also what --no-check times).
  void randomize() {
    fill_uniform(states->ptr, states->n, -0.5f, 0.5f, 21);
    fill_uniform_bf16(cache_k->ptr, cache_k->n, -0.09f, 0.09f, 22);
    fill_uniform_bf16(cache_v->ptr, cache_v->n, -1.0f, 1.0f, 23);
    fill_uniform(cache_a->ptr, cache_a->n, 0.9f, 0.999f, 24);
    fill_uniform(cache_b->ptr, cache_b->n, 0.1f, 0.9f, 25);
  }
  PriorBuffers buffers(int T) const {
    PriorBuffers b;
    b.drafts = T;
    for (int i = 0; i < 3; ++i) b.state[i] = states->ptr + state_elems * i;
    for (int c = 0; c < 2; ++c)
      b.cache[c] = {cache_k->ptr + nk * c, cache_v->ptr + nv * c, cache_a->ptr + nh * c, cache_b->ptr + nh * c};
    return b;
  }
  void set_verdicts(int batch, int prev_a, int a) {
    const std::vector<int> p(static_cast<std::size_t>(batch), prev_a), c(static_cast<std::size_t>(batch), a);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(prev->ptr, p.data(), p.size() * sizeof(int), cudaMemcpyHostToDevice));
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(accepted->ptr, c.data(), c.size() * sizeof(int), cudaMemcpyHostToDevice));
  }
};

// Validation before timing (BenchOptions::check): from a zero state, `rounds` verify steps on fresh
// random inputs, every sequence's verdict a; the outputs of sequences 0 and B - 1 against the CPU
// conventional decoder run through the T drafts from the committed state, and (where the scheme
// holds it) their committed state against the decoder's after the accepted tokens, both within
// 1e-5 (rms + |cpu|). A mismatch stops the bench naming the scheme, shape, B, T, a and the worst
// error; the tally is printed with the table.
class SpeculativeCheck {
 public:
  SpeculativeCheck(Workspace& ws, std::string model) : ws_(ws), model_(std::move(model)) {}

  // verify(): the verify phase on the workspace's inputs; recover(): the recovery after the verdict;
  // committed(): the device committed state now, or null when the scheme does not hold one to check;
  // lags: the committed state holds the verdicts up to the previous round after verify().
  void run(const std::string& scheme, int T, int a, int rounds, bool lags, const std::function<void()>& verify,
           const std::function<void()>& recover, const std::function<const float*()>& committed) {
    const DecodeShape& s = ws_.s;
    const int hpg = s.value_heads / s.key_heads;
    const ssm::HeadGroupShape group{ws_.kind, s.dk, s.dv, hpg};
    const auto policy = ssm::PrecisionPolicy::parse("conv:fp32");
    const std::vector<int> seqs = s.batch > 1 ? std::vector<int>{0, s.batch - 1} : std::vector<int>{0};
    std::vector<ssm::ConventionalDecoder> cpu;  // [seq index][g]
    for (int b : seqs)
      for (int g = 0; g < s.key_heads; ++g)
        cpu.emplace_back(group, policy, ssm::HeadGroupId{static_cast<uint32_t>(b), static_cast<uint32_t>(g)});
    CheckMeter outputs, states;
    const std::size_t per_seq_out = static_cast<std::size_t>(T) * s.value_heads * s.dv;
    const std::size_t per_seq_state = static_cast<std::size_t>(s.value_heads) * s.head_elements();
    std::vector<float> out(per_seq_out), st(per_seq_state), ref(static_cast<std::size_t>(hpg) * s.dv);
    auto compare_states = [&] {
      const float* dev = committed();
      if (!dev) return;
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        REPLAYSSM_CUDA_CHECK(cudaMemcpy(st.data(), dev + seqs[i] * per_seq_state, per_seq_state * sizeof(float),
                                        cudaMemcpyDeviceToHost));
        for (int g = 0; g < s.key_heads; ++g)
          for (int j = 0; j < hpg; ++j) {
            const auto& S = cpu[i * s.key_heads + g].state(j);
            const float* gpu = st.data() + static_cast<std::size_t>(g * hpg + j) * s.head_elements();
            states.gpu.insert(states.gpu.end(), gpu, gpu + s.head_elements());
            states.cpu.insert(states.cpu.end(), S.data(), S.data() + s.head_elements());
          }
      }
    };
    for (int round = 0; round < rounds; ++round) {
      ws_.fill_inputs(kCheckInputSeed + 8 * static_cast<uint64_t>(input_draws_++));
      const HostInputs in(ws_, T);
      verify();
      REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
      if (lags && round > 0) compare_states();
      for (std::size_t i = 0; i < seqs.size(); ++i) {
        REPLAYSSM_CUDA_CHECK(cudaMemcpy(out.data(), ws_.out->ptr + seqs[i] * per_seq_out, per_seq_out * sizeof(float),
                                        cudaMemcpyDeviceToHost));
        for (int g = 0; g < s.key_heads; ++g) {
          ssm::ConventionalDecoder& dec = cpu[i * s.key_heads + g];
          ssm::ConventionalDecoder fork = dec;
          for (int t = 0; t < T; ++t) {
            fork.step(in.token(s, seqs[i], g, t), ref.data());
            const float* gpu = out.data() + (static_cast<std::size_t>(t) * s.value_heads + g * hpg) * s.dv;
            outputs.gpu.insert(outputs.gpu.end(), gpu, gpu + ref.size());
            outputs.cpu.insert(outputs.cpu.end(), ref.begin(), ref.end());
          }
          for (int t = 0; t < a; ++t) dec.step(in.token(s, seqs[i], g, t), ref.data());
        }
      }
      recover();
      REPLAYSSM_CUDA_CHECK(cudaDeviceSynchronize());
      if (!lags) compare_states();
    }
    ws_.fill_inputs(Workspace::kTimedInputSeed);
    const double out_excess = outputs.excess(1e-5).first;
    const double state_excess = states.gpu.empty() ? 0.0 : states.excess(1e-5).first;
    worst_ = std::max({worst_, out_excess, state_excess});
    ++checked_;
    if (!(out_excess <= 1.0) || !(state_excess <= 1.0))
      throw std::runtime_error(fmt::format(
          "bench --schemes: {} on {} (B = {}, T = {}, a = {}, {} rounds) differs from the CPU conventional decode before "
          "timing: max |d| = {:.3g} x 1e-5 (rms + |cpu|) on the draft outputs, {:.3g} x on the committed state{}",
          scheme, model_, s.batch, T, a, rounds, out_excess, state_excess, states.gpu.empty() ? " (not checked)" : ""));
  }
  int checked() const { return checked_; }
  double worst() const { return worst_; }

 private:
  static constexpr uint64_t kCheckInputSeed = 5000;
  Workspace& ws_;
  std::string model_;
  int input_draws_ = 0, checked_ = 0;
  double worst_ = 0.0;
};

// ReplaySSM verification at L = 16 with every verdict a: one period of the window (from h = a after
// a flush to the next flush step, inclusive), so the flush is amortised as in a long run.
int replay_period(int T, int a, int L = 16) {
  int h = a, steps = 0;
  for (;;) {
    ++steps;
    const bool flush = h + T > L;
    h = (flush ? 0 : h) + a;
    if (flush) return steps;
  }
}

struct Row {
  std::string model, kernel;
  int batch, param;
  double us, bytes, gbps, pct_copy, speedup;
};

// The main table's row labels, in one place: the run's rows, --rows' check and bench_row_labels use these.
namespace label {
constexpr const char* kConventionalFp32 = "conventional fp32";
std::string conventional(StorageFormat f) { return fmt::format("conventional {}", formats::to_string(f)); }
constexpr StorageFormat kConventionalLowp[] = {StorageFormat::fp16, StorageFormat::bf16};
constexpr const char* kConventionalFp16Ef = "conventional fp16+ef";
constexpr const char* kStaggered = "replay fp32 (staggered windows)";
constexpr const char* kNonflush = "replay fp32 non-flush step";
constexpr const char* kFlush = "replay fp32 flush step";
constexpr const char* kAmortised = "replay fp32 amortised ((L-1)nf+f)/L";
std::string read(StorageFormat f) { return fmt::format("non-flush read {} (x over fp32 read)", formats::to_string(f)); }
constexpr StorageFormat kReads[] = {StorageFormat::fp16, StorageFormat::fp8b128, StorageFormat::nvfp4};
std::string nvfp4_skip(int quarters) { return fmt::format("nvfp4 read skip=auto, {}% skip (x no skip)", 25 * quarters); }
constexpr int kSkipQuarters[] = {0, 2, 4};
constexpr const char* kFp32Skip = "fp32 read skip=auto, 100% skip (x no skip)";
constexpr const char* kPureWriteFlush = "flush skip=auto, pure write (x flush)";
constexpr const char* kSplitFlush = "flush split nvfp4/fp32 (x shared flush)";
constexpr const char* kSplitFlushEf = "flush split nvfp4+ef/fp32 (x no ef)";
constexpr const char* kVerifyNoFlush = "verify output-only (no flush)";
constexpr const char* kVerifyFlush = "verify output-only (with flush)";
constexpr const char* kSplitVerifyNoFlush = "verify split nvfp4/fp32, LP read (no flush)";
constexpr const char* kSplitVerifyFlush = "verify split nvfp4/fp32 (with flush: both written)";
constexpr const char* kSnapshotVerify = "verify snapshot baseline (1R + T W)";
}  // namespace label

// --rows: which rows are timed (every row when the pattern is empty). check_bench_options has compiled the
// pattern once already, so a bad one never reaches a GPU.
class RowSelection {
 public:
  explicit RowSelection(const std::string& pattern) : every_(pattern.empty()) {
    if (!every_) pattern_ = std::regex(pattern, std::regex::ECMAScript);
  }
  bool operator()(const std::string& row) const { return every_ || std::regex_search(row, pattern_); }

 private:
  bool every_;
  std::regex pattern_;
};

// A row's timing inside an NVTX range named after it (bench_row_range_name): a profiler takes one row's kernels
// with ncu --nvtx --nvtx-include "<range name>/". Without a tool attached the push and pop cost next to nothing.
class RowRange {
 public:
#if REPLAYSSM_BENCH_NVTX
  explicit RowRange(const std::string& row) { nvtxRangePushA(bench_row_range_name(row).c_str()); }
  ~RowRange() { nvtxRangePop(); }
#else
  explicit RowRange(const std::string&) {}
#endif
  RowRange(const RowRange&) = delete;
  RowRange& operator=(const RowRange&) = delete;
};

// time_us inside the row's NVTX range.
double time_row(const std::string& row, int repeats, const std::function<void()>& timed,
                const std::function<void()>& prepare = {}) {
  const RowRange range(row);
  return time_us(repeats, timed, prepare);
}

std::vector<Row> scheme_table(const BenchOptions& o, DeviceArena& arena, double copy_gbps) {
  std::vector<Row> rows;
  std::printf("# Figure 7 (paper appendix A): one verify step of T drafts + the state recovery once the accepted length a "
              "is known, every sequence at the same a, in conventional FP32 steps of the same run (x conv = latency / "
              "conventional latency). Traffic: full-state reads/writes per request (prior schemes: derived from their "
              "launch plans, cuda/ssm/prior_schemes.h). ReplaySSM: verify_step + commit_step at L = 16 averaged over a "
              "window period (its flush included). vLLM snapshots: recovery is a pointer move.\n");
  std::printf("| model | B | T | scheme | state traffic | launches | serial chain a=1 / a=T | us a=1 | us a=T | x conv a=1 | "
              "x conv a=T |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
  const int max_drafts = *std::max_element(o.drafts.begin(), o.drafts.end());
  for (const std::string& name : o.shapes) {
    const ssm::ModelShape& m = ssm::find_shape(name);
    const ssm::Recurrence kind = m.kind;
    for (int B : o.batches) {
      arena.reset();
      const DecodeShape s{B, m.key_heads, m.value_heads, m.dk, m.dv};
      Workspace ws(kind, s, 16, max_drafts);
      SchemeWorkspace sw(ws, max_drafts);
      const ByteModel bm{s, kind};
      int copy = 0;
      auto next_copy = [&] { copy = (copy + 1) % ws.copies; return copy; };
      const double conv_us = time_us(o.repeats, [&] { conventional_step(kind, s, ws.inputs(), ws.fp32_state(next_copy()), nullptr); });
      std::printf("# %s B=%d: conventional FP32 step %.2f us\n", std::string(m.short_name).c_str(), B, conv_us);
      SpeculativeCheck check(ws, std::string(m.short_name));
      auto add = [&](const std::string& scheme, int T, const std::string& traffic, const std::string& launches,
                     const std::string& chain, double us1, double usT, double state_rw) {
        std::printf("| %-16s | %4d | %d | %-38s | %-14s | %-8s | %-9s | %9.2f | %9.2f | %6.2f | %6.2f |\n",
                    std::string(m.short_name).c_str(), B, T, scheme.c_str(), traffic.c_str(), launches.c_str(), chain.c_str(),
                    us1, usT, us1 / conv_us, usT / conv_us);
        std::fflush(stdout);
        const double bytes = state_rw * bm.state() + bm.inputs(T);
        for (const auto& [a, us] : {std::pair{1, us1}, std::pair{T, usT}}) {
          const double gbps = bytes / (us * 1e-6) / 1e9;
          rows.push_back({std::string(m.short_name), fmt::format("fig7 {} a={}", scheme, a == 1 ? "1" : "T"), B, T, us, bytes,
                          gbps, 100.0 * gbps / copy_gbps, conv_us / us});
        }
      };
      for (int T : o.drafts) {
        if (T < 1 || T > kMaxPriorDrafts || (T & (T - 1)) != 0)
          throw std::invalid_argument(fmt::format("bench --schemes: T must be 1, 2, 4 or 8 (got {})", T));
        const int rounds = 3;
        // ReplaySSM: verify_step + commit_step (L = 16).
        {
          ReplayConfig cfg;
          cfg.window = 16;
          cfg.recur = ws.fp32_state(0);
          if (o.check)
            for (int a : {1, T}) {
              ws.zero_states();
              ws.set_windows([](int) { return 0; });
              sw.set_verdicts(B, a, a);
              DeviceRecords rec = ws.records(T);
              check.run("ReplaySSM verify + commit", T, a, 16 / T + 2, false,
                        [&] { verify_step(kind, s, T, ws.inputs(), cfg, rec, nullptr); },
                        [&] { commit_step(s, sw.accepted->ptr, rec, nullptr); }, [] { return nullptr; });
            }
          ws.randomize_states();
          double us[2];
          for (int i = 0; i < 2; ++i) {
            const int a = i == 0 ? 1 : T, period = replay_period(T, a);
            sw.set_verdicts(B, a, a);
            us[i] = time_us(o.repeats, [&] {
              cfg.recur = ws.fp32_state(next_copy());
              DeviceRecords rec = ws.records(T);
              for (int st = 0; st < period; ++st) {
                verify_step(kind, s, T, ws.inputs(), cfg, rec, nullptr);
                commit_step(s, sw.accepted->ptr, rec, nullptr);
              }
            }, [&] { ws.set_windows([&](int) { return a; }); }) / period;
          }
          add("ReplaySSM (verify_step + commit_step)", T, "1R (+1W flush)", "2",
              "-", us[0], us[1], 1.0 + 1.0 / replay_period(T, T));
        }
        // vLLM snapshots: one launch writing T states; the verdict picks snapshot a (a pointer move).
        {
          float* cur = sw.states->ptr;
          if (o.check)
            for (int a : {1, T}) {
              REPLAYSSM_CUDA_CHECK(cudaMemset(cur, 0, ws.state_elems * sizeof(float)));
              check.run("vLLM snapshots", T, a, rounds, false,
                        [&] { snapshot_verify_step(kind, s, T, ws.inputs(), cur, sw.snaps->ptr, nullptr); },
                        [&] {  // the pointer move, emulated by a copy outside the timed code
                          REPLAYSSM_CUDA_CHECK(cudaMemcpy(cur, sw.snaps->ptr + (a - 1) * ws.state_elems,
                                                          ws.state_elems * sizeof(float), cudaMemcpyDeviceToDevice));
                        },
                        [&] { return static_cast<const float*>(cur); });
            }
          sw.randomize();
          const double us = time_us(o.repeats, [&] { snapshot_verify_step(kind, s, T, ws.inputs(), cur, sw.snaps->ptr, nullptr); });
          add("vLLM snapshots", T, fmt::format("1R + {}W", T), "1", fmt::format("{} / {}", T, T), us, us, 1.0 + T);
        }
        // The prior schemes.
        for (PriorScheme p : kPriorSchemes) {
          const std::string label(to_string(p));
          if (o.check)
            for (int a : {1, T}) {
              REPLAYSSM_CUDA_CHECK(cudaMemset(sw.states->ptr, 0, sw.states->n * sizeof(float)));
              sw.set_verdicts(B, 0, a);  // no verdict before the first verify step
              PriorBuffers buf = sw.buffers(T);
              bool first = true;
              check.run(label, T, a, rounds, prior_recovery_lags(p),
                        [&] {
                          prior_verify_step(p, kind, s, ws.inputs(), sw.prev->ptr, buf, nullptr);
                          if (first) sw.set_verdicts(B, a, a), first = false;
                        },
                        [&] { prior_recover_step(p, kind, s, sw.accepted->ptr, buf, nullptr); },
                        [&] { return prior_committed_state(p, buf); });
            }
          sw.randomize();
          double us[2];
          for (int i = 0; i < 2; ++i) {
            const int a = i == 0 ? 1 : T;
            sw.set_verdicts(B, a, a);  // steady state: the previous verdict was a too
            PriorBuffers buf = sw.buffers(T);
            us[i] = time_us(o.repeats, [&] {
              prior_verify_step(p, kind, s, ws.inputs(), sw.prev->ptr, buf, nullptr);
              prior_recover_step(p, kind, s, sw.accepted->ptr, buf, nullptr);
            });
          }
          const PriorTraffic t = prior_scheme_traffic(p);
          add(label, T, fmt::format("{}R + {}W", t.state_reads, t.state_writes), std::to_string(prior_scheme_launches(p).size()),
              fmt::format("{} / {}", prior_scheme_chain_steps(p, T, 1), prior_scheme_chain_steps(p, T, T)), us[0], us[1],
              t.state_reads + t.state_writes);
        }
      }
      if (o.check)
        std::printf("# %s B=%d: %d scheme configurations checked against the CPU conventional decode before timing "
                    "(draft outputs and committed states: max |d| = %.2f x 1e-5 (rms + |cpu|))\n",
                    std::string(m.short_name).c_str(), B, check.checked(), check.worst());
    }
  }
  return rows;
}

// The text fields are quoted (io/csv.h, RFC 4180) because kernel labels hold commas ("nvfp4 read
// skip=auto, 50% skip ..."): written bare until 2026-12-05, those rows had one field more than the header,
// and a CSV reader shifted their later columns by one. Written atomically (io/atomic_file.h); the CLI has
// refused an existing file without --force before any GPU work.
void write_csv(const std::string& path, const std::vector<Row>& rows, double copy_gbps, BenchOptions::Timer timer, bool force) {
  if (path.empty()) return;
  std::ostringstream csv;
  csv << "model,kernel,batch,param,us_per_step,bytes_per_step,gbps,pct_copy,speedup_vs_reference,copy_gbps,timer\n";
  const char* timer_name = timer == BenchOptions::Timer::queued ? "queued" : "events";
  for (const Row& r : rows)
    csv << fmt::format("{},{},{},{},{:.3f},{:.0f},{:.1f},{:.2f},{:.4f},{:.1f},{}\n", io::csv_text(r.model),
                       io::csv_text(r.kernel), r.batch, r.param, r.us, r.bytes, r.gbps, r.pct_copy, r.speedup, copy_gbps,
                       timer_name);
  io::AtomicFile out(path, /*replace_existing=*/force);
  out.write(csv.str());
  out.commit();
}

}  // namespace

void check_bench_options(const BenchOptions& o) {
  auto refuse = [](const std::string& message) { throw std::invalid_argument("bench " + message); };
  if (o.repeats < 1)
    refuse(fmt::format("--repeats must be >= 1: each time is the median of the timed repetitions (got {})", o.repeats));
  if (o.shapes.empty()) refuse("--shapes: no model shape given");
  for (const std::string& name : o.shapes) {
    try {
      ssm::find_shape(name);
    } catch (const std::invalid_argument& e) {
      refuse(fmt::format("--shapes: {}", e.what()));
    }
  }
  if (o.batches.empty()) refuse("--batch: no batch size given");
  for (int B : o.batches)  // B is a launch grid's second dimension
    if (B < 1 || B > 65535) refuse(fmt::format("--batch B must be in [1, 65535] (got {})", B));
  if (o.windows.empty()) refuse("--window: no window given");
  for (int L : o.windows)
    if (L < 1 || L > kMaxDecodeWindow)
      refuse(fmt::format("--window L must be in [1, {}], the decode kernels' largest window (got {})", kMaxDecodeWindow, L));
  if (o.drafts.empty()) refuse("--drafts: no draft count given");
  for (int T : o.drafts)
    if (std::find(std::begin(kVerifyDraftCounts), std::end(kVerifyDraftCounts), T) == std::end(kVerifyDraftCounts))
      refuse(fmt::format("--drafts T must be one of {} (the verification kernels' draft counts; got {})",
                         fmt::join(kVerifyDraftCounts, ", "), T));
  if (!std::isfinite(o.arena_gib) || o.arena_gib < 0)
    refuse(fmt::format("--arena-gib must be a finite number >= 0 (got {})", o.arena_gib));
  if (o.heads_per_block < 0) refuse(fmt::format("--heads-per-block must be >= 0 (got {})", o.heads_per_block));
  if (o.flush_heads_per_block < 0)
    refuse(fmt::format("--flush-heads-per-block must be >= 0 (got {})", o.flush_heads_per_block));
  if (!o.rows.empty()) {
    if (o.schemes) refuse("--rows selects rows of the main table; --schemes prints figure 7's table instead");
    std::regex pattern;
    try {
      pattern = std::regex(o.rows, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      refuse(fmt::format("--rows '{}': not a regular expression (ECMAScript): {}", o.rows, e.what()));
    }
    const std::vector<std::string> labels = bench_row_labels();
    if (std::none_of(labels.begin(), labels.end(), [&](const std::string& l) { return std::regex_search(l, pattern); }))
      refuse(fmt::format("--rows '{}' matches no row; the rows are: {}", o.rows, fmt::join(labels, "; ")));
  }
}

std::vector<std::string> bench_row_labels() {
  std::vector<std::string> rows = {label::kConventionalFp32};
  for (StorageFormat f : label::kConventionalLowp) rows.push_back(label::conventional(f));
  rows.insert(rows.end(), {label::kConventionalFp16Ef, label::kStaggered, label::kNonflush, label::kFlush, label::kAmortised});
  for (StorageFormat f : label::kReads) rows.push_back(label::read(f));
  for (int q : label::kSkipQuarters) rows.push_back(label::nvfp4_skip(q));
  rows.insert(rows.end(), {label::kFp32Skip, label::kPureWriteFlush, label::kSplitFlush, label::kSplitFlushEf,
                           label::kVerifyNoFlush, label::kVerifyFlush, label::kSplitVerifyNoFlush, label::kSplitVerifyFlush,
                           label::kSnapshotVerify});
  return rows;
}

std::string bench_row_range_name(const std::string& label) {
  std::string name = label;
  std::replace(name.begin(), name.end(), '/', '|');
  return name;
}

int run_decode_bench(const BenchOptions& o) {
  check_bench_options(o);  // before any GPU work
  cudaDeviceProp prop{};
  REPLAYSSM_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::unique_ptr<QueuedTimer> queued;
  if (o.timer == BenchOptions::Timer::queued) queued = std::make_unique<QueuedTimer>();
  QueuedTimer::current() = queued.get();
  struct ReleaseTimer {
    ~ReleaseTimer() { QueuedTimer::current() = nullptr; }
  } release_timer;
  const double copy_gbps = measure_copy_gbps(o.repeats);
  std::size_t free_bytes = 0, total_bytes = 0;
  REPLAYSSM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  const std::size_t spare = std::min<std::size_t>(free_bytes / 4, std::size_t{2} << 30);
  const std::size_t wanted = o.arena_gib > 0 ? static_cast<std::size_t>(o.arena_gib * double(std::size_t{1} << 30)) : free_bytes - spare;
  if (wanted > free_bytes)
    throw std::invalid_argument(fmt::format("bench --arena-gib {}: only {:.1f} GiB of device memory is free", o.arena_gib,
                                            double(free_bytes) / double(std::size_t{1} << 30)));
  DeviceArena arena(wanted);
  DeviceArena::current() = &arena;
  struct Release {
    ~Release() { DeviceArena::current() = nullptr; }
  } release;
  std::printf("# replayssm bench on %s (%d SMs, L2 %d MB): device-to-device copy %.0f GB/s (read+write)\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, copy_gbps);
  if (o.heads_per_block > 0) std::printf("# standard replay step: %d value heads per block (--heads-per-block)\n", o.heads_per_block);
  if (o.flush_heads_per_block > 0)
    std::printf("# standard replay step: %d value heads per flush block (--flush-heads-per-block)\n", o.flush_heads_per_block);
  std::printf("# timer: %s\n", o.timer == BenchOptions::Timer::queued
                                    ? "queued (each sample's work queued behind a hold kernel: the events time the GPU alone)"
                                    : "events (the events also bracket the host's launch calls: --timer events)");
  std::printf("# standard replay steps %s\n", o.flush_lists ? "with ReplayConfig::flush_list (the flushing sequences of each step)"
                                                          : "without a flush list (--no-flush-list: flush blocks on every sequence)");
  if (o.schemes) {  // figure 7 alone
    write_csv(o.csv_out, scheme_table(o, arena, copy_gbps), copy_gbps, o.timer, o.force);
    return 0;
  }
  std::vector<Row> rows;
  auto add = [&](const ssm::ModelShape& m, std::string kernel, int B, int param, double us, double bytes, double conv_us) {
    const double gbps = bytes / (us * 1e-6) / 1e9;
    rows.push_back({std::string(m.short_name), std::move(kernel), B, param, us, bytes, gbps, 100.0 * gbps / copy_gbps,
                    conv_us / us});
    const Row& r = rows.back();
    std::printf("| %-18s | %-34s | %4d | %3d | %9.2f | %9.2f | %7.0f | %5.1f%% | %5.2fx |\n", r.model.c_str(),
                r.kernel.c_str(), r.batch, r.param, r.us, r.bytes / 1e6, r.gbps, r.pct_copy, r.speedup);
    std::fflush(stdout);
  };
  std::printf("| model | kernel | B | L/T | us/step | MB/step | GB/s | %% copy | vs conv |\n|---|---|---|---|---|---|---|---|---|\n");
  const int max_window = *std::max_element(o.windows.begin(), o.windows.end());
  const int max_drafts = *std::max_element(o.drafts.begin(), o.drafts.end());
  // --rows: a row is timed when its label is selected or a timed row is measured against it (the last column).
  const RowSelection selected(o.rows);
  auto any_selected = [&](const auto& labels) {
    return std::any_of(std::begin(labels), std::end(labels), [&](const auto& l) { return selected(l); });
  };
  std::vector<std::string> read_rows, skip_rows;
  for (StorageFormat f : label::kReads) read_rows.push_back(label::read(f));
  for (int q : label::kSkipQuarters) skip_rows.push_back(label::nvfp4_skip(q));
  const bool time_skips = any_selected(skip_rows);
  const bool time_nvfp4_read = selected(label::read(StorageFormat::nvfp4)) || time_skips;
  const bool time_split_flush_ef = selected(label::kSplitFlushEf);
  const bool time_split_flush = selected(label::kSplitFlush) || time_split_flush_ef;
  const bool time_flush = selected(label::kFlush) || selected(label::kAmortised) || selected(label::kPureWriteFlush) ||
                          time_split_flush;
  const bool time_nonflush = selected(label::kNonflush) || selected(label::kAmortised) || selected(label::kFp32Skip) ||
                             any_selected(read_rows) || time_nvfp4_read;
  if (!o.rows.empty()) std::printf("# rows: those whose label matches '%s', and the rows they are measured against\n", o.rows.c_str());
  if (!REPLAYSSM_BENCH_NVTX) std::printf("# no NVTX ranges: this build's CUDA toolkit has no nvtx3 headers\n");
  for (const std::string& name : o.shapes) {
    const ssm::ModelShape& m = ssm::find_shape(name);
    const ssm::Recurrence kind = m.kind;
    for (int B : o.batches) {
      arena.reset();  // the previous configuration's buffers are gone: start again at the base
      const DecodeShape s{B, m.key_heads, m.value_heads, m.dk, m.dv};
      Workspace ws(kind, s, max_window, max_drafts);
      if (o.check) check_kernels(kind, ws, m, o.windows, o.drafts, o.heads_per_block, o.flush_heads_per_block, o.flush_lists);
      const ByteModel bm{s, kind};
      int copy = 0;
      auto next_copy = [&] { copy = (copy + 1) % ws.copies; return copy; };
      // Conventional FP32 (the bar, and every row's "vs conv" column: timed whatever --rows selects).
      const double conv_us = time_row(label::kConventionalFp32, o.repeats,
                                      [&] { conventional_step(kind, s, ws.inputs(), ws.fp32_state(next_copy()), nullptr); });
      add(m, label::kConventionalFp32, B, 1, conv_us, bm.conventional(), conv_us);
      for (StorageFormat f : label::kConventionalLowp) {
        if (!selected(label::conventional(f))) continue;
        DeviceState st = ws.lowp_state(f, 0);
        const double us = time_row(label::conventional(f), o.repeats, [&] {
          st = ws.lowp_state(f, next_copy());
          conventional_step(kind, s, ws.inputs(), st, nullptr);
        });
        add(m, label::conventional(f), B, 1, us, 2 * bm.lowp_state(f) + bm.inputs(), conv_us);
      }
      if (selected(label::kConventionalFp16Ef)) {  // error feedback: the fp32 residual read and written besides the fp16 state
        DeviceState st = ws.lowp_state(StorageFormat::fp16, 0);
        const double us = time_row(label::kConventionalFp16Ef, o.repeats, [&] {
          st = ws.lowp_state(StorageFormat::fp16, next_copy());
          st.residual = ws.residual->ptr;
          conventional_step(kind, s, ws.inputs(), st, nullptr, formats::Rounding::ef);
        });
        add(m, label::kConventionalFp16Ef, B, 1, us, 2 * bm.lowp_state(StorageFormat::fp16) + 2 * bm.residual() + bm.inputs(),
            conv_us);
      }
      for (int L : o.windows) {
        ReplayConfig cfg;
        cfg.window = L;
        cfg.heads_per_block = o.heads_per_block;
        cfg.flush_heads_per_block = flush_heads_for(kind, o.flush_heads_per_block);
        // Whole windows, sequences staggered (h_b = b mod L): every step has B/L flushing sequences.
        const FlushSchedule staggered_lists(kind, B, L, [&](int b) { return b % L; }, o.flush_lists);
        auto run_window = [&](const ReplayConfig& c) {
          DeviceRecords rec = ws.records();
          for (int t = 0; t < L; ++t) replay_step(kind, s, ws.inputs(), staggered_lists.at(c, t), rec, nullptr);
        };
        cfg.recur = ws.fp32_state(0);
        if (selected(label::kStaggered)) {
          const double staggered =
              time_row(label::kStaggered, std::max(3, o.repeats / 3), [&] { cfg.recur = ws.fp32_state(next_copy()); run_window(cfg); },
                       [&] { ws.set_windows([&](int b) { return b % L; }); }) / L;
          add(m, label::kStaggered, B, L, staggered, bm.window(L, bm.state()) / L, conv_us);
        }
        // Aligned: one non-flush step (h0 = L/2) and one flush step, timed separately. Every sequence is at h0,
        // so a step's flush list is every sequence (h0 = L - 1) or none.
        const FlushSchedule none_flush(kind, B, L, [&](int) { return 0; }, o.flush_lists),
            all_flush(kind, B, L, [&](int) { return L - 1; }, o.flush_lists);
        auto aligned = [&](const ReplayConfig& c, int h0) { return (h0 + 1 >= L ? all_flush : none_flush).at(c, 0); };
        auto one_step = [&](const std::string& row, const ReplayConfig& c, int h0) {
          return time_row(row, o.repeats, [&] {
            DeviceRecords rec = ws.records();
            replay_step(kind, s, ws.inputs(), aligned(c, h0), rec, nullptr);
          }, [&] { ws.set_windows([&](int) { return h0; }); });
        };
        const double nf32 = time_nonflush ? one_step(label::kNonflush, cfg, L / 2) : 0.0;
        const double fl = time_flush ? one_step(label::kFlush, cfg, L - 1) : 0.0;
        if (time_nonflush) add(m, label::kNonflush, B, L, nf32, bm.nonflush(L / 2, bm.state()), conv_us);
        if (time_flush) add(m, label::kFlush, B, L, fl, bm.flush(L), conv_us);
        if (time_nonflush && time_flush)
          add(m, label::kAmortised, B, L, ((L - 1) * nf32 + fl) / L, bm.window(L, bm.state()) / L, conv_us);
        double nvfp4_us = 0.0;
        for (StorageFormat f : label::kReads) {
          if (!selected(label::read(f)) && !(f == StorageFormat::nvfp4 && time_nvfp4_read)) continue;
          ReplayConfig split = cfg;
          split.read = ws.lowp_state(f, 0);
          const double us = time_row(label::read(f), o.repeats, [&] {
            const int c = next_copy();
            split.recur = ws.fp32_state(c);
            split.read = ws.lowp_state(f, c);
            DeviceRecords rec = ws.records();
            replay_step(kind, s, ws.inputs(), aligned(split, L / 2), rec, nullptr);
          }, [&] { ws.set_windows([&](int) { return L / 2; }); });
          add(m, label::read(f), B, L, us, bm.nonflush(L / 2, bm.lowp_state(f)), nf32);
          if (f == StorageFormat::nvfp4) nvfp4_us = us;
        }
        // Appendix F: non-flush steps with skip=auto when 0, 2 or 4 of every 4 value heads skip their
        // read (their current decay set to 1e-9), against the same read without skipping; and a flush
        // that is a pure write for every head. The 0% row is the cost of the decisions alone.
        for (int quarters : label::kSkipQuarters) {
          if (!selected(label::nvfp4_skip(quarters))) continue;
          ws.fill_inputs(Workspace::kTimedInputSeed);
          ws.set_head_decays(quarters, 1e-9f);
          ReplayConfig skip = cfg;
          skip.skip_threshold_read = formats::unit_roundoff(StorageFormat::nvfp4);
          skip.skip_threshold_flush = formats::unit_roundoff(StorageFormat::fp32);
          const double us = time_row(label::nvfp4_skip(quarters), o.repeats, [&] {
            const int c = next_copy();
            skip.recur = ws.fp32_state(c);
            skip.read = ws.lowp_state(StorageFormat::nvfp4, c);
            DeviceRecords rec = ws.records();
            replay_step(kind, s, ws.inputs(), aligned(skip, L / 2), rec, nullptr);
          }, [&] { ws.set_windows([&](int) { return L / 2; }); });
          add(m, label::nvfp4_skip(quarters), B, L, us,
              bm.nonflush(L / 2, bm.lowp_state(StorageFormat::nvfp4) * (1.0 - quarters / 4.0)), nvfp4_us);
        }
        if (selected(label::kFp32Skip) || selected(label::kPureWriteFlush)) {
          ReplayConfig skip = cfg;
          skip.skip_threshold_read = skip.skip_threshold_flush = formats::unit_roundoff(StorageFormat::fp32);
          auto skipped_step = [&](const std::string& row, int h0) {
            return time_row(row, o.repeats, [&] {
              skip.recur = ws.fp32_state(next_copy());
              DeviceRecords rec = ws.records();
              replay_step(kind, s, ws.inputs(), aligned(skip, h0), rec, nullptr);
            }, [&] { ws.set_windows([&](int) { return h0; }); });
          };
          ws.set_head_decays(4, 1e-9f);
          if (selected(label::kFp32Skip))
            add(m, label::kFp32Skip, B, L, skipped_step(label::kFp32Skip, L / 2), bm.nonflush(L / 2, 0.0), nf32);
          if (selected(label::kPureWriteFlush))
            add(m, label::kPureWriteFlush, B, L, skipped_step(label::kPureWriteFlush, L - 1), bm.flush(L) - bm.state(), fl);
        }
        ws.fill_inputs(Workspace::kTimedInputSeed);  // the timed decays again
        // Error feedback on the NVFP4 read copy of a split flush (its fp32 residual read and written).
        double split_flush_us = 0.0;
        for (bool ef : {false, true}) {
          const char* row = ef ? label::kSplitFlushEf : label::kSplitFlush;
          if (!(ef ? time_split_flush_ef : time_split_flush)) continue;
          ReplayConfig split = cfg;
          if (ef) split.read_rounding = formats::Rounding::ef;
          const double us = time_row(row, o.repeats, [&] {
            const int c = next_copy();
            split.recur = ws.fp32_state(c);
            split.read = ws.lowp_state(StorageFormat::nvfp4, c);
            split.read.residual = ef ? ws.residual->ptr : nullptr;
            DeviceRecords rec = ws.records();
            replay_step(kind, s, ws.inputs(), aligned(split, L - 1), rec, nullptr);
          }, [&] { ws.set_windows([&](int) { return L - 1; }); });
          if (!ef) split_flush_us = us;
          add(m, row, B, L, us, bm.flush(L) + bm.lowp_state(StorageFormat::nvfp4) + (ef ? 2 * bm.residual() : 0.0),
              ef ? split_flush_us : fl);
        }
      }
      // Speculative verification at L = 16: output-only (no flush: h = 0; flush: h = 16 - T + 1)
      // against the snapshot baseline (1 read + T writes).
      std::unique_ptr<Buffer<float>> snaps;
      for (int T : o.drafts) {
        ReplayConfig cfg;
        cfg.window = 16;
        cfg.recur = ws.fp32_state(0);
        auto verify_at = [&](const char* row, int h0) {
          return time_row(row, o.repeats, [&] {
            cfg.recur = ws.fp32_state(next_copy());
            DeviceRecords rec = ws.records(T);
            verify_step(kind, s, T, ws.inputs(), cfg, rec, nullptr);
          }, [&] { ws.set_windows([&](int) { return h0; }); });
        };
        if (selected(label::kVerifyNoFlush))
          add(m, label::kVerifyNoFlush, B, T, verify_at(label::kVerifyNoFlush, 0), bm.state() + bm.inputs(T) + T * bm.record(),
              conv_us);
        // With a flush at h = 16 - T + 1, the step reads the h committed records and writes the T drafts' records.
        const int h_flush = 16 - T + 1;
        if (selected(label::kVerifyFlush))
          add(m, label::kVerifyFlush, B, T, verify_at(label::kVerifyFlush, h_flush),
              2 * bm.state() + bm.inputs(T) + (h_flush + T) * bm.record(), conv_us);
        // Algorithm 3 (decode_verify_split.cu, written for clarity, not yet tuned): NVFP4 LP read
        // without a flush; with a flush the HP read, the fold and both writes.
        auto split_verify_at = [&](const char* row, int h0) {
          ReplayConfig split = cfg;
          return time_row(row, o.repeats, [&] {
            const int c = next_copy();
            split.recur = ws.fp32_state(c);
            split.read = ws.lowp_state(StorageFormat::nvfp4, c);
            DeviceRecords rec = ws.records(T);
            verify_step(kind, s, T, ws.inputs(), split, rec, nullptr);
          }, [&] { ws.set_windows([&](int) { return h0; }); });
        };
        if (selected(label::kSplitVerifyNoFlush))
          add(m, label::kSplitVerifyNoFlush, B, T, split_verify_at(label::kSplitVerifyNoFlush, 0),
              bm.lowp_state(StorageFormat::nvfp4) + bm.inputs(T) + T * bm.record(), conv_us);
        if (selected(label::kSplitVerifyFlush))
          add(m, label::kSplitVerifyFlush, B, T, split_verify_at(label::kSplitVerifyFlush, h_flush),
              2 * bm.state() + bm.lowp_state(StorageFormat::nvfp4) + bm.inputs(T) + (h_flush + T) * bm.record(), conv_us);
        if (kind == ssm::Recurrence::kda) continue;  // the snapshot baseline is written for scalar decays
        if (!selected(label::kSnapshotVerify)) continue;
        if (!snaps || snaps->n < ws.state_elems * T) snaps = std::make_unique<Buffer<float>>(ws.state_elems * max_drafts);
        const double sv = time_row(label::kSnapshotVerify, o.repeats, [&] {
          snapshot_verify_step(kind, s, T, ws.inputs(), ws.state->ptr + ws.state_elems * next_copy(), snaps->ptr, nullptr);
        });
        add(m, label::kSnapshotVerify, B, T, sv, (1.0 + T) * bm.state() + bm.inputs(T), conv_us);
      }
    }
  }
  write_csv(o.csv_out, rows, copy_gbps, o.timer, o.force);
  return 0;
}

}  // namespace replayssm::cuda
