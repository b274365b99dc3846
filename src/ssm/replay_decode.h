// ReplaySSM decoding of one head group, literally as REPLAYSSM.md sections 2-4 state it: a
// checkpoint in memory plus a ring buffer of input records, flushed every L steps.
//
//   step()            standard decode, Algorithms 1 (Mamba-2) and 4 (GDN; KDA alike): the new
//                     record is appended; a non-flush step (h < L after appending) computes its
//                     output without materialising any state (OUTPUTONLY with T = 1; GDN/KDA get
//                     their correction u_t from the same one-pass form), or, with
//                     NonFlushForm::materialize, by REPLAY + o = S q exactly as the algorithms'
//                     pseudocode reads; the flush step (h == L) materialises
//                     S = REPLAY(S_ckpt, B[1:L]), outputs S q and writes the checkpoint.
//   verify(), commit() speculative decoding, Algorithm 2: T draft records are written after the
//                     h committed ones, OUTPUTONLY gives the T outputs (GDN/KDA: the UT transform
//                     solves the drafts' corrections), and if h + T > L the h committed records
//                     are flushed first-thing (the checkpoint is rewritten, the ring drops them);
//                     commit(a) then moves the pointer h <- h + a. Rejected records stay in the
//                     ring past h and are overwritten by the next call.
//
// ReplayDecoder is the shared-checkpoint scheme (one checkpoint, read by every step and carrying
// the recurrence). SplitPrecisionReplayDecoder is Algorithm 3: an HP checkpoint carries the
// recurrence and is read by flush steps only; an LP checkpoint (RTN) is read by non-flush steps;
// a flush replays from the HP checkpoint and writes both, Q_HP(S) and Q_LP(S). For GDN/KDA the
// records keep (a, b, u, v, k): non-flush steps use the cached u (computed from the LP checkpoint),
// a flush recomputes every u_j^HP from the raw inputs on the HP path.
//
// Checkpoint writes are numbered 0, 1, 2, ... per decoder (the SR event of state_quantizer.h), in
// the same order as the sequence emulator's flushes, so both quantize with the same streams.
//
// Ring buffer: capacity max(L, T) + T (the spec's L + T when T <= L; when T > L a commit can leave
// h = T > L committed records before the next flush, so L + T would not suffice). Every write is
// checked: overwriting a live record (committed and not flushed, or a draft) throws std::logic_error.
//
// Bits: with NonFlushForm::materialize every replayed state is the fold of the same plain steps the
// emulator and conventional decode run, so checkpoints are bit-identical to theirs. With
// output_only, Mamba-2 and every split policy still are (Mamba-2 folds v; split flushes recompute
// u^HP), but a shared GDN/KDA checkpoint folds corrections computed in the one-pass form, a few
// ulps from the running state's, so its checkpoints agree only to float32 rounding (and an SR or
// RTN boundary can then round an element differently). Algorithm 4 as written materialises.
// Freed slots (flushed or rejected records) are overwritten with NaN, so a computation that read
// a dead record would produce non-finite outputs.
#pragma once
#include <memory>
#include <span>
#include <vector>

#include "ssm/conventional_decode.h"
#include "ssm/decoder.h"

namespace replayssm::ssm {

enum class NonFlushForm : uint8_t {
  output_only,  // o_t = g_h S_ckpt q_t + sum_j g_{j+1:h} u_j (k_j^T q_t): no state materialised
  materialize,  // S = REPLAY(S_ckpt, B[1:h]); (GDN: u = b (v - a S k)); S <- a S + u k^T; o = S q
};

struct ReplayDecoderOptions {
  int max_draft = 1;  // largest T accepted by verify()
  NonFlushForm non_flush = NonFlushForm::output_only;
  int ring_capacity = 0;  // 0: max(L, max_draft) + max_draft. Smaller values exist to test the guard.
};

struct RingStats {
  int capacity = 0;
  int max_live = 0;                // most records held at once (committed + drafts)
  int64_t records_written = 0;
  int64_t records_rejected = 0;    // drafts released by commit(a < T)
  int64_t records_flushed = 0;     // committed records folded into a checkpoint
};

// The record buffer of one head group: per slot the key (shared by the value heads) and, per
// value head, a, b, v and the correction u. Window position p (0-based) lives in slot
// (start + p) mod capacity.
class RecordRing {
 public:
  enum class SlotState : uint8_t { free, draft, committed };
  RecordRing(const HeadGroupShape& shape, int capacity);

  int capacity() const { return capacity_; }
  // Writes token x at window position p. Throws std::logic_error if that slot holds a live record:
  // a committed, not yet flushed one (the guard of paper appendix D.1) or a draft.
  void write(int p, const GroupToken& x, SlotState as);
  void set_u(int p, int g, const Eigen::Ref<const Eigen::RowVectorXf>& u);
  // Drafts at positions [p, p + count) become committed records / are released (NaN-filled).
  void commit(int p, int count);
  void release(int p, int count);
  // Flush: the first `count` positions (committed records) are folded into the checkpoint; they
  // are freed (NaN-filled) and position `count` becomes position 0.
  void drop_front(int count);
  // Copies positions [0, n) in window order: keys into K, value head records into recs[g].
  void gather(int n, RowMatrix& K, std::vector<WindowRecords>& recs) const;
  SlotState state_at(int p) const { return state_[static_cast<std::size_t>(slot(p))]; }
  const RingStats& stats() const { return stats_; }

 private:
  int slot(int p) const { return (start_ + p) % capacity_; }
  void poison(int p);

  HeadGroupShape shape_;
  int capacity_;
  int start_ = 0;
  int live_ = 0;
  std::vector<SlotState> state_;
  RowMatrix k_;                       // capacity x dk
  std::vector<RowMatrix> alpha_;      // per value head: capacity x decay_width
  std::vector<Vector> beta_;          // per value head: capacity
  std::vector<RowMatrix> v_, u_;      // per value head: capacity x dv
  RingStats stats_;
};

// The machinery both ReplaySSM schemes share. Not constructible directly: use ReplayDecoder or
// SplitPrecisionReplayDecoder.
class ReplayDecoderBase : public HeadGroupDecoder {
 public:
  // Algorithms 1/4 (see the file comment). Throws std::logic_error while drafts await commit().
  void step(const GroupToken& x, float* out) override;
  // Algorithm 2 / 3: verifies T = drafts.size() draft tokens (1 <= T <= max_draft); out receives
  // T x n_value_heads x dv outputs (token major). commit() must follow before the next call.
  void verify(std::span<const GroupToken> drafts, float* out);
  // Accepts the first `accepted` drafts (1 <= accepted <= T): h <- h + accepted.
  void commit(int accepted);

  const HeadGroupShape& shape() const override { return shape_; }
  int64_t tokens() const override { return tokens_; }
  int64_t quantization_events() const override { return flushes_; }
  int64_t flushes() const { return flushes_; }
  int window() const { return policy_.window; }
  int committed() const { return h_; }        // h: committed records not yet flushed
  int pending_drafts() const { return pending_; }
  const RingStats& ring_stats() const { return ring_.stats(); }
  const PrecisionPolicy& policy() const { return policy_; }

 protected:
  ReplayDecoderBase(const HeadGroupShape& shape, const PrecisionPolicy& policy, HeadGroupId id,
                    const ReplayDecoderOptions& options);

  bool split() const { return policy_.scheme == DecodeScheme::split; }
  // The checkpoint a step reads: flush steps the recurrence copy, others the read copy.
  const StateMatrix& checkpoint_for(int g, bool flush) const;
  // Quantizes S into the checkpoint(s) of value head g at event flushes_.
  void write_checkpoints(int g, const StateMatrix& S);
  // Appendix F (',skip='): whether this standard step of a head skips its checkpoint read, from the
  // window's n records (non-flush steps read the read copy, flushes the recur copy).
  bool skips_checkpoint_read(const WindowRecords& rec, int n, bool flush);

  HeadGroupShape shape_;
  PrecisionPolicy policy_;
  HeadGroupId id_;
  ReplayDecoderOptions options_;
  std::vector<StateMatrix> recur_;  // shared: the checkpoint; split: S_ckpt^HP
  std::vector<StateMatrix> read_;   // split: S_ckpt^LP
  std::vector<StateMatrix> recur_residual_, read_residual_;  // error feedback (+ef) of each copy
  RecordRing ring_;
  int h_ = 0, pending_ = 0;
  int64_t flushes_ = 0, tokens_ = 0;

 private:
  // Scratch, sized once.
  RowMatrix K_, Q_, O_;
  std::vector<WindowRecords> recs_;
  KeyProducts products_;
  OutputOnlyScratch oo_;
  ReplayScratch rs_;
  StateMatrix S_;
  Vector q_, o_, gamma_;
};

// Shared checkpoint (one copy read by every step and carrying the recurrence).
class ReplayDecoder final : public ReplayDecoderBase {
 public:
  // policy.scheme must be shared.
  ReplayDecoder(const HeadGroupShape& shape, const PrecisionPolicy& policy, HeadGroupId id = {},
                const ReplayDecoderOptions& options = {});
  const StateMatrix& checkpoint(int g) const { return recur_.at(static_cast<std::size_t>(g)); }
};

// Algorithm 3: separate HP (recurrence) and LP (read) checkpoints.
class SplitPrecisionReplayDecoder final : public ReplayDecoderBase {
 public:
  // policy.scheme must be split.
  SplitPrecisionReplayDecoder(const HeadGroupShape& shape, const PrecisionPolicy& policy, HeadGroupId id = {},
                              const ReplayDecoderOptions& options = {});
  const StateMatrix& recur_checkpoint(int g) const { return recur_.at(static_cast<std::size_t>(g)); }
  const StateMatrix& read_checkpoint(int g) const { return read_.at(static_cast<std::size_t>(g)); }
};

// The literal decoder of a policy: ConventionalDecoder, ReplayDecoder or SplitPrecisionReplayDecoder.
std::unique_ptr<HeadGroupDecoder> make_decoder(const HeadGroupShape& shape, const PrecisionPolicy& policy,
                                               HeadGroupId id = {}, const ReplayDecoderOptions& options = {});

}  // namespace replayssm::ssm
