"""Issue 13's decode-kernel targets, judged from the CSVs of `replayssm bench` (rounds of one run) and of the
outside peers (scripts/bench_peers.py, scripts/bench_fla.py) measured in the same call.

Every ratio is taken inside one round (the bench times a shape's rows back to back, so a ratio within a round
cancels the drift between rounds) and then summarised over the rounds (median by default). A target whose rows
are missing is reported as not measured, never as met.

The targets (FP32 state, L = 16, B = 256 unless a row names another B; docs/BENCHMARKS.md):
  conventional FP32 kernel            >= 92% of the copy bandwidth measured in the same run
  staggered replay step               >= 1.75x conventional on Nemotron-3-Super, >= 1.6x on every other shape;
                                      >= 1.25x at B = 32; >= 1.0x at every other B >= 8 in the CSVs
  flush step                          <= 1.1 conventional steps
  non-flush reads over the FP32 read  FP16 >= 1.7x, FP8-b128 >= 2.8x, NVFP4 >= 3.8x
  verification, T drafts              <= 1.1 conventional steps without a flush, <= 1.5 with one (Mamba-2, GDN)
  vLLM's ReplaySSM kernel             its staggered step >= 1.3x ours, Mamba-2 shapes, every B >= 32 measured
  every other peer                    its time > ours (our staggered step), wherever both ran
A peer's verdict names its timer ([events] or [graph]; peer CSVs without a timer column are events-timed). The
bench's CSVs name theirs too (queued or events; without the column: events, every run before session 27), and
rounds of both timers are not judged together.
"""
import csv
import lzma
import math
import statistics
from dataclasses import dataclass, field

# The recurrence of each bench shape, as src/ssm/model_shapes.cpp has it (tests/python/test_decode_targets.py
# checks this table against `replayssm traffic`).
SHAPE_RECURRENCE = {
    "nemotron-3-nano-4b": "Mamba-2",
    "nemotron-3-super": "Mamba-2",
    "qwen3.5-4b": "GDN",
    "qwen3.5-122b-a10b": "GDN",
    "kimi-linear-48b-a3b": "KDA",
}

TARGET_BATCH = 256
CONVENTIONAL = "conventional fp32"
STAGGERED = "replay fp32 (staggered windows)"
NONFLUSH = "replay fp32 non-flush step"
FLUSH = "replay fp32 flush step"
LP_READS = {"FP16": ("non-flush read fp16 (x over fp32 read)", 1.7),
            "FP8-b128": ("non-flush read fp8b128 (x over fp32 read)", 2.8),
            "NVFP4": ("non-flush read nvfp4 (x over fp32 read)", 3.8)}
VERIFY = {"no flush": ("verify output-only (no flush)", 1.1), "with a flush": ("verify output-only (with flush)", 1.5)}
VLLM_REPLAY = "vllm replayssm_output_only (staggered)"
VLLM_MIN_RATIO = 1.3

# Peer CSVs before session 26 have no timer column; every one of them was timed with events.
PEER_TIMERS = ("events", "graph")
DEFAULT_PEER_TIMER = "events"
# The bench's timers (BenchOptions::Timer); CSVs before session 27 have no timer column and were events-timed.
BENCH_TIMERS = ("queued", "events")
DEFAULT_BENCH_TIMER = "events"
BENCH_FIELDS = ("model", "kernel", "batch", "us_per_step", "pct_copy")
PEER_FIELDS = ("model", "kernel", "batch", "us_per_step")
STATISTICS = {"median": statistics.median, "min": min, "max": max}


class TargetsInputError(ValueError):
    """A CSV that cannot be judged; the message names the file, the row and the field."""


def _open(path):
    return lzma.open(path, "rt", newline="") if str(path).endswith(".xz") else open(path, newline="")


def _read_rows(path, fields, default_timer=None):
    """{(model, kernel, batch): row} of one CSV, every field checked: positive finite times, integer batches."""
    rows = {}
    try:
        with _open(path) as f:
            reader = csv.DictReader(f)
            missing = [c for c in fields if c not in (reader.fieldnames or [])]
            if missing:
                raise TargetsInputError(f"{path}: header lacks the field(s) {', '.join(missing)} "
                                        f"(expected a CSV with {', '.join(fields)})")
            for n, r in enumerate(reader, start=2):
                def number(name, kind=float, positive=True):
                    text = r.get(name)
                    try:
                        value = kind(text)
                    except (TypeError, ValueError):
                        value = None
                    if value is None or not math.isfinite(value) or (positive and value <= 0):
                        raise TargetsInputError(f"{path}: line {n}: field '{name}': expected a "
                                                f"{'positive ' if positive else ''}{'integer' if kind is int else 'number'}, "
                                                f"got {text!r}")
                    return value
                key = (r["model"], r["kernel"], number("batch", int))
                if key in rows:
                    raise TargetsInputError(f"{path}: line {n}: row ({key[0]}, {key[1]}, B = {key[2]}) appears twice "
                                            "(one file is one round)")
                rows[key] = {"us": number("us_per_step"),
                             "pct_copy": number("pct_copy") if "pct_copy" in fields else None}
                # How the row was timed: a peer's (peer_timing.TIMERS) or the bench's (BenchOptions::Timer).
                timers = PEER_TIMERS if "pct_copy" not in fields else BENCH_TIMERS
                timer = r.get("timer") or default_timer
                if timer not in timers:
                    raise TargetsInputError(f"{path}: line {n}: field 'timer': expected one of "
                                            f"{', '.join(timers)}, got {timer!r}")
                rows[key]["timer"] = timer
    except OSError as e:
        raise TargetsInputError(f"{path}: cannot read ({e.strerror or e})") from e
    except (lzma.LZMAError, UnicodeDecodeError, csv.Error) as e:
        raise TargetsInputError(f"{path}: not a readable CSV ({e})") from e
    if not rows:
        raise TargetsInputError(f"{path}: no rows")
    return rows


def read_bench_csv(path):
    return _read_rows(path, BENCH_FIELDS, DEFAULT_BENCH_TIMER)


def read_peer_csv(path, default_timer=DEFAULT_PEER_TIMER):
    """default_timer: the timer of a CSV without a timer column (session 26's call 4 wrote graph-timed ones)."""
    if default_timer not in PEER_TIMERS:
        raise TargetsInputError(f"{path}: unknown peer timer {default_timer!r} (expected one of {', '.join(PEER_TIMERS)})")
    return _read_rows(path, PEER_FIELDS, default_timer)


def meets(value, relation, limit):
    """Whether a target's value holds against its limit (relation ">=", "<=" or ">")."""
    return {">=": value >= limit, "<=": value <= limit, ">": value > limit}[relation]


@dataclass
class Verdict:
    shape: str
    target: str
    batch: int
    relation: str  # ">=", "<=" or ">"
    limit: float
    per_round: list = field(default_factory=list)  # the value in each round that has the rows
    value: float = math.nan  # summarised over per_round
    bench_timer: str = DEFAULT_BENCH_TIMER  # how our rows were timed (BENCH_TIMERS)

    @property
    def measured(self):
        return bool(self.per_round)

    @property
    def met(self):
        return self.measured and meets(self.value, self.relation, self.limit)

    @property
    def status(self):
        return "not measured" if not self.measured else ("met" if self.met else "missed")


def _ratio(rnd, num_key, den_key):
    num, den = rnd.get(num_key), rnd.get(den_key)
    return None if num is None or den is None else num["us"] / den["us"]


def judge(bench_rounds, peer_files=(), statistic="median"):
    """Verdicts for every target and shape in the bench rounds (a list of read_bench_csv results) and the peer
    CSVs (read_peer_csv results; their times are summarised over the files before the ratio)."""
    if not bench_rounds:
        raise TargetsInputError("no bench CSV given")
    bench_timers = sorted({r.get("timer", DEFAULT_BENCH_TIMER) for rnd in bench_rounds for r in rnd.values()})
    if len(bench_timers) > 1:
        raise TargetsInputError(f"the bench CSVs mix timers ({', '.join(bench_timers)}): judge the rounds of one timer "
                                "together (`replayssm bench --timer`; a CSV without a timer column was events-timed)")
    bench_timer = bench_timers[0]
    summarise = STATISTICS[statistic]
    order = list(SHAPE_RECURRENCE)
    shapes = sorted({k[0] for rnd in bench_rounds for k in rnd},
                    key=lambda s: (order.index(s) if s in order else len(order), s))
    batches = sorted({k[2] for rnd in bench_rounds for k in rnd})
    verdicts = []

    def add(shape, target, batch, relation, limit, value_of_round):
        v = Verdict(shape, target, batch, relation, limit, bench_timer=bench_timer)
        v.per_round = [x for x in (value_of_round(rnd) for rnd in bench_rounds) if x is not None]
        if v.per_round:
            v.value = summarise(v.per_round)
        verdicts.append(v)

    B = TARGET_BATCH
    for s in shapes:
        recurrence = SHAPE_RECURRENCE.get(s)
        pct = lambda rnd, s=s: rnd[(s, CONVENTIONAL, B)]["pct_copy"] if (s, CONVENTIONAL, B) in rnd else None
        add(s, "conventional FP32, % of copy", B, ">=", 92.0, pct)
        stag = lambda b, s=s: (lambda rnd: _ratio(rnd, (s, CONVENTIONAL, b), (s, STAGGERED, b)))
        add(s, "staggered step, x conventional", B, ">=", 1.75 if s == "nemotron-3-super" else 1.6, stag(B))
        add(s, "staggered step, x conventional", 32, ">=", 1.25, stag(32))
        for b in batches:
            if b >= 8 and b not in (32, B):
                add(s, "staggered step, x conventional", b, ">=", 1.0, stag(b))
        add(s, "flush step, conventional steps", B, "<=", 1.1,
            lambda rnd, s=s: _ratio(rnd, (s, FLUSH, B), (s, CONVENTIONAL, B)))
        for name, (kernel, limit) in LP_READS.items():
            add(s, f"{name} read, x FP32 read", B, ">=", limit,
                lambda rnd, s=s, kernel=kernel: _ratio(rnd, (s, NONFLUSH, B), (s, kernel, B)))
        if recurrence in ("Mamba-2", "GDN"):
            for name, (kernel, limit) in VERIFY.items():
                add(s, f"verification {name}, conventional steps", B, "<=", limit,
                    lambda rnd, s=s, kernel=kernel: _ratio(rnd, (s, kernel, B), (s, CONVENTIONAL, B)))

    # Peers: times summarised over their files, ours (the staggered step) over the rounds.
    peer_us = {}
    for rows in peer_files:
        for (m, kern, b), r in rows.items():
            peer_us.setdefault((m, f"{kern} [{r.get('timer', DEFAULT_PEER_TIMER)}]", b), []).append(r["us"])
    ours = {}
    for rnd in bench_rounds:
        for (m, kern, b), r in rnd.items():
            if kern == STAGGERED:
                ours.setdefault((m, b), []).append(r["us"])
    for (m, kern, b), times in sorted(peer_us.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        relation, limit = (">=", VLLM_MIN_RATIO) if kern.startswith(VLLM_REPLAY + " [") and b >= 32 else (">", 1.0)
        v = Verdict(m, f"{kern}, x our staggered step", b, relation, limit, bench_timer=bench_timer)
        if (m, b) in ours:  # else not measured: the bench did not run this shape at this B
            v.value = summarise(times) / summarise(ours[(m, b)])
            v.per_round = [v.value]
        verdicts.append(v)
    return verdicts


def format_markdown(verdicts):
    lines = ["| shape | target | B | value | needs | verdict |", "|---|---|---|---|---|---|"]
    for v in verdicts:
        value = f"{v.value:.3f}" if v.measured else "-"
        spread = f" ({min(v.per_round):.3f}-{max(v.per_round):.3f})" if len(v.per_round) > 1 else ""
        lines.append(f"| {v.shape} | {v.target} | {v.batch} | {value}{spread} | {v.relation} {v.limit:g} | {v.status} |")
    counts = {s: sum(v.status == s for v in verdicts) for s in ("met", "missed", "not measured")}
    lines.append("")
    if verdicts:
        lines.append(f"Our rows: `replayssm bench --timer {verdicts[0].bench_timer}` "
                     + ("(each sample queued behind a hold kernel: the GPU's time alone)."
                        if verdicts[0].bench_timer == "queued" else
                        "(the events also bracket the host's launch calls; one-step rows include them)."))
    if any(v.target.endswith("[events], x our staggered step") for v in verdicts):
        lines.append("Peers marked [events] were timed with CUDA events around each Python call, which counts the host's "
                     "launch path into short kernels (replayssm_py/peer_timing.py); [graph] peers were not.")
    lines.append(f"{counts['met']} met, {counts['missed']} missed, {counts['not measured']} not measured "
                 f"(of {len(verdicts)})")
    return "\n".join(lines) + "\n"


def csv_rows(verdicts):
    return [[v.shape, v.target, v.batch, f"{v.value:.6g}" if v.measured else "", v.relation, f"{v.limit:g}",
             len(v.per_round), v.status] for v in verdicts]


CSV_HEADER = ["model", "target", "batch", "value", "relation", "limit", "rounds", "status"]
