// Teacher-forced KL between the FP32 reference and a configuration (REPLAYSSM.md section 10),
// computed from rows of log-probabilities or raw logits chunk by chunk, in double precision:
//
//   KL_t = sum_v p_ref,t(v) (log p_ref,t(v) - log p_cfg,t(v))
//
// Each row is renormalised in double first (log p = row - logsumexp(row)), so a row of raw logits
// and a row of log-probabilities define the same distribution (up to the float32 rounding of the
// latter), a float32 log_softmax that sums to 1 +- rounding defines the distribution exactly, and
// identical rows give KL = 0 exactly. Terms with p_ref = 0 contribute 0; p_ref = 0 means
// exp(log p_ref - max) is 0 in double (log p_ref = -inf, or more than ~745 below the row's max).
//
// The sum is evaluated in a form without cancellation (kl_terms.h): KL = F/W + G0/W + (log1p(v) - v)
// with non-negative F, G0 and |v| small for close rows, so a KL of 1e-10 is resolved to ~1e-15
// relative (the direct sum above, the earlier evaluation, was off by 3e-4 relative at 5e-11).
// Error: ~2^-53 (c sqrt(vocab) + m^2 / (2 KL)) relative, m = E_p[log p_ref - log p_cfg] minus its
// value at the reference's top token (of the size of sqrt(2 KL) for noise-like differences; a
// row where only the top token moves is the bad case: 1e-11 measured at KL 4e-7).
// The CPU (compare_positions) and the GPU (cuda::compare_positions_gpu) evaluate the same terms;
// they differ only in the order of the sums.
//
// Non-finite values are results, never errors: a configuration row holding NaN or +-Inf, or a KL
// that comes out non-finite (log p_cfg = -inf where p_ref > 0), marks the position non-finite. Its
// KL is stored as computed (NaN or +Inf), it is counted, and it is left out of every mean, of
// top-1 agreement, of delta-p and of the percentiles. A reference row holding NaN or +Inf (should
// never happen under FP32) makes the position non-finite as well and is counted separately.
//
// Positions are 0-based; the length of position t is t + 1 (tokens consumed). Length buckets are
// (edges[k], edges[k+1]] over lengths, see length_bucket_edges.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <Eigen/Dense>

#include "eval/kl_terms.h"

namespace replayssm::eval {

using LogProbRows = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

// Bucket edges for a run of n positions: {0, e, 2e, 4e, ..., n}, e = clamp(2^floor(log2(n/64)),
// 16, 1024): for long runs the buckets are the paper's (0,1K], (1K,2K], (2K,4K], ... and the last
// one ends at n; short runs get finer buckets below 1K (n = 4096: e = 64). n <= e gives {0, n};
// n = 0 gives {0}.
std::vector<int64_t> length_bucket_edges(int64_t n);
// Index k of the bucket (edges[k], edges[k+1]] holding `length` (1 <= length <= edges.back()).
int bucket_of(const std::vector<int64_t>& edges, int64_t length);

struct PositionResult {
  double kl = 0.0;            // NaN or +Inf when not finite
  double delta_p = 0.0;       // p_cfg(target) - p_ref(target)
  // log p_ref(target), log p_cfg(target) (renormalised rows, natural log): the perplexity ratio's
  // terms. -Inf where the row gives the target probability 0; unset (0) without a target or when
  // the position is not finite.
  double ref_logp_target = 0.0, cfg_logp_target = 0.0;
  bool has_target = false;    // false when target < 0 (no next token known; delta_p and logp unset)
  bool top1_agree = false;    // argmax p_ref == argmax p_cfg (first index on ties)
  bool finite = true;         // false: counted as non-finite and excluded from the statistics
  bool ref_finite = true;     // false when the reference row holds NaN or +Inf
  int64_t nonfinite_values = 0;  // NaN/+-Inf entries in the configuration row
};

// One position. target < 0: no next token known; target >= vocab: std::invalid_argument.
PositionResult compare_position(const float* ref, const float* cfg, int vocab, int32_t target);

// `rows` positions: row i of ref and of cfg starts at ref + i * ld, cfg + i * ld (row-major,
// ld >= vocab); targets[i] is its next token (< 0: none). out[i] = compare_position(row i), on up
// to `threads` threads (at most one per 8 rows). Throws std::invalid_argument on vocab < 1,
// ld < vocab or a target >= vocab (naming the row), before computing anything.
void compare_positions(const float* ref, const float* cfg, int64_t rows, int vocab, int64_t ld, const int32_t* targets,
                       PositionResult* out, int threads = 1);

// A row pair's two-pass sums (kl_terms.h) to its result: the one evaluation of the final formulas,
// for the CPU rows and the rows summed on the GPU alike.
PositionResult finish_position(const kl::RowSums& sums);

// Percentiles of the finite values (numpy's default "linear" method, so np.percentile of the
// stored float32 values reproduces them exactly); all NaN when there is no finite value.
struct Percentiles {
  static constexpr std::array<double, 5> kLevels = {50.0, 90.0, 99.0, 99.9, 100.0};  // p50 p90 p99 p99.9 max
  std::array<double, 5> value{};
};
Percentiles percentiles(std::span<const float> values);

// ---- uncertainty -------------------------------------------------------------------------------
// Neighbouring positions share the state's error, so their KLs are correlated: standard errors come
// from a block bootstrap over positions (non-overlapping blocks, Carlstein 1986). Each bucket is cut
// into blocks of bootstrap_block_lengths(edges)[k] = min(e, its size / 8) positions (at least b),
// e the first bucket edge: for runs of 64K positions and more 128 positions up to 2K, then 256, 512
// and 1024 from (8K, 16K] on, so every bucket holds >= 8 blocks per book and the long buckets'
// blocks outlast the correlation (measured on the bundled models' 128K results: the batch-means SE
// is 1.15-1.38x the iid formula at 128-position blocks, 1.20-1.42x at 1024 and 4096). The cells
// store sums over base blocks of b = bootstrap_block_length(edges) = e / 8 positions [j b, (j + 1) b)
// (the last may be shorter); b divides every bucket edge but N and every bucket's block length, so
// a bucket's blocks are runs of base blocks.
inline constexpr int kBootstrapResamples = 1000;
inline constexpr uint64_t kBootstrapSeed = 0x5EEDB0075u;  // recorded in every result file
int64_t bootstrap_block_length(const std::vector<int64_t>& edges);
std::vector<int64_t> bootstrap_block_lengths(const std::vector<int64_t>& edges);

// Per-block sums of one (configuration, book) cell, from which every bootstrap replicate is built.
struct BlockSums {
  int64_t block_length = 1;
  std::vector<int64_t> count;          // finite positions
  std::vector<double> kl_sum;          // their KL
  std::vector<int64_t> top1_agree;     // of which the argmaxes agree
  std::vector<int64_t> target_count;   // finite positions with a known next token
  std::vector<double> logratio_sum;    // their log p_ref(target) - log p_cfg(target)
  std::size_t size() const { return count.size(); }
};

// Standard errors of the mean KL, the top-1 agreement and the perplexity ratio, overall and per
// bucket; NaN where not defined (fewer than 2 blocks, or fewer than 2 replicates with a value).
struct StandardErrors {
  double mean_kl, top1, ppl_ratio;
  std::vector<double> bucket_mean, bucket_top1, bucket_ppl_ratio;  // [K]
  explicit StandardErrors(std::size_t buckets = 0);
};

// Block bootstrap over the blocks of every stratum (one BlockSums per book): a replicate draws, in
// each stratum and each bucket, as many of that stratum's blocks of the bucket (runs of base blocks,
// bootstrap_block_lengths) as it has, with replacement, and pools them; each statistic is a ratio of pooled sums (mean KL = sum KL / count,
// ppl ratio = exp(sum logratio / targets)); SE = the replicates' standard deviation (n - 1). The
// draws come from one splitmix64 stream seeded with `seed`, in a fixed order, so the same blocks
// give the same SEs. Throws std::invalid_argument when a stratum's blocks do not match the edges.
StandardErrors block_bootstrap(std::span<const BlockSums* const> strata, const std::vector<int64_t>& edges,
                               int resamples = kBootstrapResamples, uint64_t seed = kBootstrapSeed);

// The spread of independent estimates (books, or SR seeds of one policy) as the standard error of
// their mean: sd(values, n - 1) / sqrt(n) over the finite values; NaN with fewer than 2.
double spread_standard_error(std::span<const double> values);

// Statistics of one (book, configuration) cell or of several merged.
struct KlStats {
  std::vector<int64_t> edges;          // bucket edges (lengths), size K + 1
  std::vector<double> bucket_sum;      // sum of finite KL per bucket (double)
  std::vector<int64_t> bucket_count;   // finite positions per bucket
  int64_t positions = 0;               // positions seen
  int64_t finite_positions = 0;
  int64_t nonfinite_positions = 0;     // positions left out (configuration or reference non-finite)
  int64_t ref_nonfinite_positions = 0; // of which the reference row was non-finite
  int64_t nonfinite_values = 0;        // NaN/Inf entries in configuration log-prob rows
  int64_t top1_agree = 0;              // finite positions whose argmaxes agree
  int64_t delta_p_count = 0;           // finite positions with a known next token
  double kl_sum = 0.0, delta_p_sum = 0.0;
  double delta_p_sq_sum = 0.0;         // sum of delta_p^2 (RMS delta-p)
  double logratio_sum = 0.0;           // sum of log p_ref(target) - log p_cfg(target) (perplexity ratio)
  double ref_nll_sum = 0.0;            // sum of -log p_ref(target) (the reference's perplexity)
  // Per bucket, over the finite positions (with a known next token for the last three).
  std::vector<int64_t> bucket_top1_agree, bucket_target_count;
  std::vector<double> bucket_delta_p_sq_sum, bucket_logratio_sum;
  // False only for statistics read from a version-1 result file, which stored no per-bucket top-1:
  // bucket_top1() is then NaN. (Its other missing sums read as NaN.)
  bool bucket_top1_known = true;
  BlockSums blocks;                    // filled by add(); not merged (strata stay apart: block_bootstrap)
  // Set by CellAccumulator::finish / the merge (recomputed from stored values), not by merge():
  Percentiles pct;                     // over all positions
  std::vector<Percentiles> bucket_pct; // per bucket
  StandardErrors se;                   // block bootstrap
  // Aggregates only: the spread of the per-book means (bucket and overall), and of the per-seed
  // means when the sweep ran this policy under several SR seeds (seed_group: their names).
  double mean_kl_book_se;
  std::vector<double> bucket_mean_book_se;
  double mean_kl_seed_se;
  std::vector<double> bucket_mean_seed_se;
  std::vector<std::string> seed_group;

  explicit KlStats(std::vector<int64_t> bucket_edges = {});
  void add(int64_t position, const PositionResult& r);
  // Adds the counts and sums of `other` (same edges). Percentiles are not mergeable: recompute
  // them from the stored per-position values (percentiles()).
  void merge(const KlStats& other);

  double mean_kl() const;                 // NaN when no finite position
  double top1() const;                    // fraction of finite positions; NaN when none
  double mean_delta_p() const;            // NaN when none
  double rms_delta_p() const;             // sqrt(mean delta_p^2); NaN when none
  // exp(mean(-log p_cfg(target)) - mean(-log p_ref(target))); ppl() and ref_ppl() the two
  // perplexities. NaN when no finite position has a target.
  double ppl_ratio() const;
  double ppl() const;
  double ref_ppl() const;
  std::vector<double> bucket_mean() const;  // NaN for buckets without finite positions
  std::vector<double> bucket_top1() const;
  std::vector<double> bucket_rms_delta_p() const;
  std::vector<double> bucket_ppl_ratio() const;
};

// Accumulates one (book, configuration) cell: n positions, added in any order of chunks. The
// per-position KL is kept (float32) for storage and exact percentiles.
class CellAccumulator {
 public:
  // threads: worker threads for the rows of a chunk (0: hardware concurrency).
  CellAccumulator(int64_t n_positions, std::vector<int64_t> edges, int threads = 0);
  // Rows 0.. of ref and cfg are positions first, first+1, ...; targets[i] is the true next token
  // of position first + i (or -1). Throws std::invalid_argument on shape mismatches, bad targets,
  // rows past n or positions added before. compare_positions, then add_results.
  void add_chunk(int64_t first, const Eigen::Ref<const LogProbRows>& ref, const Eigen::Ref<const LogProbRows>& cfg,
                 std::span<const int32_t> targets);
  // Results computed elsewhere (cuda::compare_positions_gpu) for positions first, first+1, ...,
  // accumulated as add_chunk accumulates its own. Throws std::invalid_argument on rows past n or
  // positions added before (then nothing is added).
  void add_results(int64_t first, std::span<const PositionResult> results);
  bool complete() const { return added_ == n_; }
  int64_t positions_added() const { return added_; }
  const std::vector<float>& kl() const { return kl_; }
  // Statistics with percentiles; throws std::logic_error unless complete().
  KlStats finish() const;

 private:
  int64_t n_;
  int64_t added_ = 0;
  int threads_;
  std::vector<float> kl_;
  std::vector<uint8_t> seen_;
  KlStats stats_;
  std::vector<PositionResult> results_;

  void check_unseen(int64_t first, int64_t rows) const;
};

}  // namespace replayssm::eval
