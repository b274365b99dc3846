// What the decode kernels' GPU suites share (test_decode_cuda, test_decode_kda_cuda,
// test_prior_schemes_cuda): device buffers, the comparison of GPU values with their CPU reference,
// the stored-state and record buffers of the decode kernels, and the check that an LP copy is the
// RTN quantization of an FP32 HP copy, bit for bit.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <boost/random/mersenne_twister.hpp>
#include <boost/random/normal_distribution.hpp>
#include <boost/random/uniform_real_distribution.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <cstdint>
#include <cstdlib>
#include <cuda_bf16.h>
#include <string>
#include <utility>
#include <vector>

#include "cuda_check.h"
#include "formats/quantized_matrix.h"
#include "ssm/decode_kernels.h"
#include "ssm/decoder.h"
#include "test_util.h"

namespace replayssm::test {

using cuda::DecodeShape;
using formats::StorageFormat;

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  std::size_t n = 0;
  explicit DeviceArray(std::size_t count) : n(count) {
    REPLAYSSM_CUDA_CHECK(cudaMalloc(&ptr, std::max<std::size_t>(1, count) * sizeof(T)));
    REPLAYSSM_CUDA_CHECK(cudaMemset(ptr, 0, std::max<std::size_t>(1, count) * sizeof(T)));
  }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  void upload(const std::vector<T>& h) { REPLAYSSM_CUDA_CHECK(cudaMemcpy(ptr, h.data(), n * sizeof(T), cudaMemcpyHostToDevice)); }
  std::vector<T> download() const {
    std::vector<T> h(n);
    REPLAYSSM_CUDA_CHECK(cudaMemcpy(h.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
  }
};

// ReplayConfig::flush_list for one standard step, from the caller's own count h[b] of each sequence's
// committed records (the CPU decoders' or a host-side model's, never the GPU's window states): the
// sequences with h + 1 >= L, in increasing order. listed() returns `config` with the list set.
struct FlushList {
  DeviceArray<int> list;
  int count = 0;
  explicit FlushList(int batch) : list(static_cast<std::size_t>(batch)) {}
  cuda::ReplayConfig listed(cuda::ReplayConfig config, const std::vector<int>& h) {
    std::vector<int> flushing(list.n, -1);
    count = 0;
    for (std::size_t b = 0; b < h.size(); ++b)
      if (h[b] + 1 >= config.window) flushing[static_cast<std::size_t>(count++)] = static_cast<int>(b);
    list.upload(flushing);
    config.flush_list = list.ptr;
    config.flush_count = count;
    return config;
  }
};

// Every GPU value of a case and its CPU reference, compared at the end with the comparison rule of
// test_util.h relative to the case's RMS value: |gpu - cpu| <= tol (rms|cpu| + |cpu|), because a
// plain per-element relative error blows up on outputs that nearly cancel. A NaN (an unwritten,
// poisoned output) never matches. Each element also keeps the state row it reads, (sequence, value
// head, output row) = (b H + head) dv + j: the output buffer's offset for one-token steps, given
// apart for verification, whose offsets also count the draft token.
struct Collected {
  std::vector<double> gpu, cpu;
  std::vector<std::size_t> rows;
  static constexpr std::size_t kRowIsOffset = static_cast<std::size_t>(-1);
  void add(const std::vector<float>& g, std::size_t offset, const std::vector<float>& ref,
           std::size_t first_row = kRowIsOffset) {
    gpu.insert(gpu.end(), g.begin() + static_cast<std::ptrdiff_t>(offset),
               g.begin() + static_cast<std::ptrdiff_t>(offset + ref.size()));
    cpu.insert(cpu.end(), ref.begin(), ref.end());
    const std::size_t row0 = first_row == kRowIsOffset ? offset : first_row;
    for (std::size_t i = 0; i < ref.size(); ++i) rows.push_back(row0 + i);
  }
  test::Tolerance tolerance(double tol) const { return {tol * test::rms(cpu.data(), cpu.size()), tol}; }
  test::Closeness close(double tol, const std::string& what) const {
    return test::compare_close(gpu, cpu, tolerance(tol), what);
  }
  // The distinct state rows read by the elements outside close(tol), and by all elements.
  std::pair<std::size_t, std::size_t> rows_outside(double tol) const {
    const test::Tolerance t = tolerance(tol);
    std::vector<std::size_t> all(rows), outside;
    for (std::size_t i = 0; i < gpu.size(); ++i)
      if (!test::within_tolerance(gpu[i], cpu[i], t)) outside.push_back(rows[i]);
    for (auto* v : {&all, &outside}) std::sort(v->begin(), v->end()), v->erase(std::unique(v->begin(), v->end()), v->end());
    return {outside.size(), all.size()};
  }
};

// Where the outputs of sequence b, draft token t (of T) and key head g's first value head start in a step's
// output buffer [B][T][H][dv]; with T = 1, t = 0 it is also the first state row, (b H + g H/G) dv, they read.
inline std::size_t out_offset(const DecodeShape& s, int b, int T, int t, int g) {
  return ((static_cast<std::size_t>(b) * T + t) * s.value_heads + static_cast<std::size_t>(g) * s.heads_per_group()) * s.dv;
}

// Low-precision states: GPU and CPU each round their own FP32 update (or quantize their own recur
// checkpoint for the read copy, which the replay test checks bit for bit against the GPU's own);
// a 1-ulp difference there can flip one stored code, which moves the output of the row that holds it
// by up to one code step, at every token that reads it until the next fold. Elements outside the
// FP32-path tolerance `tol` are such flips: they are counted and reported; at most 0.1% of the elements
// may be, unless they all lie in one state row (one flipped code read at several tokens, which a case
// with few outputs cannot hold within 0.1%: session 32); and every element stays within one code step,
// 0.25 (rms + |cpu|). (Counting rows alone against 0.1% of the rows failed cases with many steps per
// row, which quantize each row many times: session 33.)
void check_with_flips(const Collected& meter, double tol, const std::string& what) {
  const auto close = meter.close(tol, what);
  const auto [flipped_rows, rows] = meter.rows_outside(tol);
  MESSAGE(what << ": " << close.mismatches << " of " << close.count << " elements, in " << flipped_rows << " of " << rows
               << " state rows, beyond the FP32-path tolerance (flipped low-precision codes)");
  INFO(close.report());
  CHECK((close.mismatches * 1000 <= close.count || flipped_rows == 1));
  CHECK_CLOSE(meter.close(0.25, what + " within one code step"));
}

// One step's inputs for the whole batch (T tokens for verification), host copies as floats that
// are exactly the bf16 values the GPU reads.
struct HostStep {
  int tokens = 1;
  std::vector<__nv_bfloat16> q, k, v;  // [B][T][G][dk], [B][T][H][dv]
  std::vector<float> qf, kf, vf, alpha, beta;
};

// Decays of the generated heads: near 1 (slow), 0.3-0.8 (fast: windows of 16 decay far below the
// low-precision skip thresholds of appendix F), or per value head alternating (mixed: a replay block
// holds heads that skip and heads that do not).
enum class Decays { slow, fast, mixed };

struct InputGen {
  boost::random::mt19937_64 rng;
  Decays decays;
  InputGen(uint64_t seed, bool slow) : rng(seed), decays(slow ? Decays::slow : Decays::fast) {}
  InputGen(uint64_t seed, Decays d) : rng(seed), decays(d) {}
  HostStep make(ssm::Recurrence kind, const DecodeShape& s, int tokens) {
    boost::random::normal_distribution<float> normal(0.0f, 1.0f);
    boost::random::uniform_real_distribution<float> unit(0.0f, 1.0f);
    HostStep st;
    st.tokens = tokens;
    const std::size_t nk = static_cast<std::size_t>(s.batch) * tokens * s.key_heads * s.dk;
    const std::size_t nv = static_cast<std::size_t>(s.batch) * tokens * s.value_heads * s.dv;
    st.q.resize(nk), st.k.resize(nk), st.v.resize(nv), st.qf.resize(nk), st.kf.resize(nk), st.vf.resize(nv);
    for (std::size_t base = 0; base < nk; base += s.dk) {
      // GDN keys and queries are L2-normalised (Qwen3.5), Mamba-2 B/C are not.
      float nq = 0, nkk = 0;
      std::vector<float> q(s.dk), k(s.dk);
      for (int c = 0; c < s.dk; ++c) q[c] = normal(rng), k[c] = normal(rng), nq += q[c] * q[c], nkk += k[c] * k[c];
      for (int c = 0; c < s.dk; ++c) {
        const float qq = kind == ssm::Recurrence::gdn ? q[c] / std::sqrt(nq) : q[c] * 0.1f;
        const float kk = kind == ssm::Recurrence::gdn ? k[c] / std::sqrt(nkk) : k[c] * 0.1f;
        st.q[base + c] = __float2bfloat16(qq), st.k[base + c] = __float2bfloat16(kk);
        st.qf[base + c] = __bfloat162float(st.q[base + c]), st.kf[base + c] = __bfloat162float(st.k[base + c]);
      }
    }
    for (std::size_t i = 0; i < nv; ++i) st.v[i] = __float2bfloat16(normal(rng)), st.vf[i] = __bfloat162float(st.v[i]);
    const std::size_t nh = static_cast<std::size_t>(s.batch) * tokens * s.value_heads;
    st.alpha.resize(nh), st.beta.resize(nh);
    for (std::size_t i = 0; i < nh; ++i) {
      const bool slow = decays == Decays::slow || (decays == Decays::mixed && (i % s.value_heads) % 2 == 0);
      st.alpha[i] = slow ? 0.999f + 0.001f * unit(rng) : 0.3f + 0.5f * unit(rng);
      st.beta[i] = 0.05f + 0.9f * unit(rng);
    }
    return st;
  }
};

// Device copies of a step.
struct DeviceStep {
  DeviceArray<__nv_bfloat16> q, k, v;
  DeviceArray<float> alpha, beta, out;
  DeviceStep(const HostStep& h, std::size_t out_elems)
      : q(h.q.size()), k(h.k.size()), v(h.v.size()), alpha(h.alpha.size()), beta(h.beta.size()), out(out_elems) {
    q.upload(h.q), k.upload(h.k), v.upload(h.v), alpha.upload(h.alpha), beta.upload(h.beta);
    std::vector<float> poison(out_elems, std::numeric_limits<float>::quiet_NaN());
    out.upload(poison);
  }
  cuda::StepInputs inputs() { return {q.ptr, k.ptr, v.ptr, alpha.ptr, beta.ptr, out.ptr}; }
};

// Token s of sequence b, key head g, as the CPU decoder's GroupToken (pointers into h).
ssm::GroupToken group_token(const HostStep& h, const DecodeShape& s, int b, int g, int tok) {
  ssm::GroupToken t;
  const std::size_t kh = (static_cast<std::size_t>(b) * h.tokens + tok) * s.key_heads + g;
  t.q = &h.qf[kh * s.dk];
  t.k = &h.kf[kh * s.dk];
  for (int j = 0; j < s.heads_per_group(); ++j) {
    const std::size_t vh = (static_cast<std::size_t>(b) * h.tokens + tok) * s.value_heads + g * s.heads_per_group() + j;
    t.alpha.push_back(&h.alpha[vh]);
    t.beta.push_back(h.beta[vh]);
    t.v.push_back(&h.vf[vh * s.dv]);
  }
  return t;
}

// Sanitizer runs are slow: REPLAYSSM_DECODE_CASES="a|b" keeps only the cases whose label (recurrence
// and policy) contains every '|'-separated part, in the suites that label their cases this way. Unset:
// every case runs. (REPLAYSSM_TEST_SHARD, test_util.h, splits a long case into parts that together run all of it.)
inline bool case_selected(const std::string& label) {
  const char* env = std::getenv("REPLAYSSM_DECODE_CASES");
  if (env == nullptr || *env == '\0') return true;
  std::string parts(env);
  for (std::size_t at = 0; at <= parts.size();) {
    const std::size_t bar = std::min(parts.find('|', at), parts.size());
    if (label.find(parts.substr(at, bar - at)) == std::string::npos) return false;
    at = bar + 1;
  }
  return true;
}

struct StateBuffers {
  DeviceArray<uint8_t> payload, scale_codes;
  DeviceArray<float> block_scales, tensor_scales, residual;
  cuda::DeviceState view;
  // error_feedback: a zeroed residual buffer (the copy rounds with ef).
  StateBuffers(StorageFormat f, const DecodeShape& s, bool error_feedback = false)
      : payload(formats::storage_bytes(f, 1, s.head_elements()) * s.heads()),
        scale_codes(f == StorageFormat::nvfp4 ? s.heads() * s.head_elements() / 16 : 0),
        block_scales(f == StorageFormat::fp8b128 ? s.heads() * s.head_elements() / 128 : 0),
        tensor_scales(f == StorageFormat::nvfp4 ? s.heads() : 0),
        residual(error_feedback ? s.heads() * s.head_elements() : 0) {
    view.residual = error_feedback ? residual.ptr : nullptr;
    view.format = f;
    view.payload = payload.ptr;
    view.scale_codes = f == StorageFormat::nvfp4 ? scale_codes.ptr : nullptr;
    view.block_scales = f == StorageFormat::fp8b128 ? block_scales.ptr : nullptr;
    view.tensor_scales = f == StorageFormat::nvfp4 ? tensor_scales.ptr : nullptr;
  }
};

// decay_width: floats of one decay (KDA: dk; records.alpha is [B][cap][H][width]).
struct RecordBuffers {
  DeviceArray<__nv_bfloat16> k, v;
  DeviceArray<float> u, alpha, beta;
  DeviceArray<cuda::WindowState> w0, w1;
  cuda::DeviceRecords view;
  RecordBuffers(const DecodeShape& s, int capacity, const std::vector<cuda::WindowState>& initial, int decay_width = 1)
      : k(static_cast<std::size_t>(s.batch) * capacity * s.key_heads * s.dk),
        v(static_cast<std::size_t>(s.batch) * capacity * s.value_heads * s.dv),
        u(static_cast<std::size_t>(s.batch) * capacity * s.value_heads * s.dv),
        alpha(static_cast<std::size_t>(s.batch) * capacity * s.value_heads * decay_width),
        beta(static_cast<std::size_t>(s.batch) * capacity * s.value_heads), w0(s.batch), w1(s.batch) {
    // Empty records are neutral: a = 1, v = u = k = 0 (so staggered window positions need no history).
    std::vector<float> ones(alpha.n, 1.0f);
    alpha.upload(ones);
    w0.upload(initial);
    view = {capacity, k.ptr, v.ptr, u.ptr, alpha.ptr, beta.ptr, {w0.ptr, w1.ptr}, 0};
  }
};

// The LP copy of head `head` in `read` (downloaded once) against formats::quantize_matrix of the FP32
// HP values `hp` (dv x dk) with RTN: payload, block scales and tensor scale bit for bit.
struct ReadCopyHost {
  StorageFormat format;
  std::vector<uint8_t> payload, codes;
  std::vector<float> scales, tensor;
  explicit ReadCopyHost(const StateBuffers& read)
      : format(read.view.format), payload(read.payload.download()), codes(read.scale_codes.download()),
        scales(read.block_scales.download()), tensor(read.tensor_scales.download()) {}
  // With error feedback: `residual_before` (the head's residual before the write) is added to hp
  // first, and `residual_after` must equal (hp + before) - Q(hp + before) bit for bit as well.
  bool equals_quantized(const float* hp, int dv, int dk, std::size_t head, const float* residual_before = nullptr,
                        const float* residual_after = nullptr) const {
    const std::size_t n = static_cast<std::size_t>(dv) * dk;
    std::vector<float> y(hp, hp + n);
    if (residual_before)
      for (std::size_t i = 0; i < n; ++i) y[i] += residual_before[i];
    const auto q = formats::quantize_matrix(y.data(), dv, dk, format, formats::Rounding::rtn);
    if (residual_after) {
      std::vector<float> dq(n);
      formats::dequantize_matrix(q, dq.data());
      for (std::size_t i = 0; i < n; ++i) {
        const float want = y[i] - dq[i];
        if (std::memcmp(&want, &residual_after[i], sizeof(float)) != 0 && !(std::isnan(want) && std::isnan(residual_after[i])))
          return false;
      }
    }
    auto at = [&](const auto& v, std::size_t per_head) { return v.begin() + static_cast<std::ptrdiff_t>(head * per_head); };
    bool same = std::equal(q.payload.begin(), q.payload.end(), at(payload, q.payload.size()));
    if (!q.block_scale_codes.empty())
      same = same && std::equal(q.block_scale_codes.begin(), q.block_scale_codes.end(), at(codes, q.block_scale_codes.size()));
    if (!q.block_scales.empty())
      same = same && std::equal(q.block_scales.begin(), q.block_scales.end(), at(scales, q.block_scales.size()));
    if (format == StorageFormat::nvfp4) same = same && q.tensor_scale == tensor[head];
    return same;
  }
};

// The LP copies written at a flush or fold from an FP32 HP copy: for every value head of the
// sequences with written[b] != 0, ReadCopyHost::equals_quantized of the GPU's own HP values, with
// error feedback (residual_before not empty) also the residual the write left. Counts each head
// into `checks`, and those that differ into `mismatches`.
inline void check_lp_writes(const StateBuffers& recur, const StateBuffers& read, const std::vector<float>& residual_before,
                            const std::vector<char>& written, const DecodeShape& s, int& checks, int& mismatches) {
  const auto recur_bytes = recur.payload.download();
  const float* hp = reinterpret_cast<const float*>(recur_bytes.data());
  const ReadCopyHost lp(read);
  const bool ef = !residual_before.empty();
  const std::vector<float> residual_after = ef ? read.residual.download() : std::vector<float>{};
  for (int b = 0; b < s.batch; ++b)
    for (int hd = 0; written[static_cast<std::size_t>(b)] && hd < s.value_heads; ++hd) {
      const std::size_t head = static_cast<std::size_t>(b) * s.value_heads + hd, at = head * s.head_elements();
      const bool same = lp.equals_quantized(hp + at, s.dv, s.dk, head, ef ? &residual_before[at] : nullptr,
                                            ef ? &residual_after[at] : nullptr);
      ++checks;
      mismatches += !same;
    }
}

}  // namespace replayssm::test
