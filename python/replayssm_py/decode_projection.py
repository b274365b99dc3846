"""Issue 13's targets carried from one card to another: a projection, never a measurement.

Issue 13's targets are H200 targets, but most runs of record were made on H100s. When one library has run on both
cards (a *pair*: the same kernels, the same timer), each target's value on the second card over its value on the
first is that target's card factor. A later run on the first card, times each factor, projects where that run's
targets would land on the second card:

    projected = value(run, card A) * value(pair, card B) / value(pair, card A)

The model behind it: each row's time moves between the cards by a factor of its own (a byte-bound kernel by the
ratio of the cards' bandwidths, an issue-bound one by nearly 1: the H200 has the H100's SMs and clocks), and that
factor is the same for the pair's kernels and the run's. A ratio of two rows then moves by the ratio of their
factors, and the conventional kernel's % of copy by its factor over the copy's. It holds exactly when the run's
kernels keep the pair's bounds; where a kernel changed since the pair (or its bound did) the projection is only an
estimate, which is why every output says "projected".

Only the bench's own targets are projected: the peers' versions and timers changed between runs."""
import math
from dataclasses import dataclass

from replayssm_py import decode_targets as dt
from replayssm_py.decode_targets import STATISTICS, TargetsInputError, judge, meets

# The bench rows issue 13's targets are taken from.
TARGET_ROWS = [dt.CONVENTIONAL, dt.STAGGERED, dt.NONFLUSH, dt.FLUSH] + [k for k, _ in dt.LP_READS.values()] + \
    [k for k, _ in dt.VERIFY.values()]


@dataclass
class Projection:
    shape: str
    target: str
    batch: int
    relation: str
    limit: float
    pair_from: float  # the target's value in the pair's run on the first card
    pair_to: float    # ... on the second card
    run: float        # the value in the run being projected (first card)
    run_met: bool

    @property
    def factor(self):
        return self.pair_to / self.pair_from

    @property
    def projected(self):
        return self.run * self.factor

    @property
    def projected_met(self):
        return meets(self.projected, self.relation, self.limit)


def project(pair_from_rounds, pair_to_rounds, run_rounds, statistic="median"):
    """Projections of the run's bench targets (read_bench_csv rounds, first card) onto the second card, from the pair
    (the same library's rounds on the first and the second card). Targets measured in all three only; the pair's two
    sides must share a timer (the run may use another: its ratios are the same kind of quantity)."""
    def bench_verdicts(rounds, what):
        """{(shape, target, B): measured verdict} and the rounds' timer (judge refuses rounds that mix timers)."""
        try:
            verdicts = judge(rounds, (), statistic)
        except TargetsInputError as e:
            raise TargetsInputError(f"{what}: {e}") from e
        return {(v.shape, v.target, v.batch): v for v in verdicts if v.measured}, verdicts[0].bench_timer

    (a, t_from), (b, t_to) = bench_verdicts(pair_from_rounds, "the pair's first card"), \
        bench_verdicts(pair_to_rounds, "the pair's second card")
    if t_from != t_to:
        raise TargetsInputError(f"the pair's two cards were timed differently ({t_from} and {t_to}): a card factor "
                                "needs the same library timed the same way on both")
    run, _ = bench_verdicts(run_rounds, "the run")
    out = []
    for key, v in run.items():
        if key in a and key in b and a[key].value > 0 and math.isfinite(b[key].value):
            out.append(Projection(v.shape, v.target, v.batch, v.relation, v.limit, a[key].value, b[key].value, v.value,
                                  v.met))
    return out


def row_factors(pair_from_rounds, pair_to_rounds, statistic="median"):
    """{(shape, kernel, B): the row's time on the second card over its time on the first}, each time summarised over
    its card's rounds: where each kernel's time goes between the cards (byte-bound rows near the copy rates' ratio,
    issue-bound ones near 1)."""
    summarise = STATISTICS[statistic]

    def times(rounds):
        out = {}
        for rnd in rounds:
            for key, r in rnd.items():
                out.setdefault(key, []).append(r["us"])
        return {key: summarise(v) for key, v in out.items()}

    a, b = times(pair_from_rounds), times(pair_to_rounds)
    return {key: b[key] / a[key] for key in a if key in b}


def format_row_factors(factors, kernels, card_from="first card", card_to="second card"):
    lines = [f"| shape | row | B | time on the {card_to} / on the {card_from} |", "|---|---|---|---|"]
    for (shape, kernel, batch), f in factors.items():
        if kernel in kernels:
            lines.append(f"| {shape} | {kernel} | {batch} | {f:.3f} |")
    return "\n".join(lines) + "\n"


def format_projection(projections, card_from="first card", card_to="second card"):
    lines = [f"| shape | target | B | pair: {card_from} | pair: {card_to} | factor | run ({card_from}) | "
             f"**projected ({card_to})** | needs | projected verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in projections:
        lines.append(f"| {p.shape} | {p.target} | {p.batch} | {p.pair_from:.3f} | {p.pair_to:.3f} | {p.factor:.3f} | "
                     f"{p.run:.3f} ({'met' if p.run_met else 'missed'}) | **{p.projected:.3f}** | {p.relation} {p.limit:g} | "
                     f"{'met' if p.projected_met else 'missed'} (projected) |")
    met_run = sum(p.run_met for p in projections)
    met_proj = sum(p.projected_met for p in projections)
    lines += ["", f"Run on the {card_from}: {met_run} met of {len(projections)} targets measured in all three runs; "
              f"projected on the {card_to}: {met_proj} met (a projection, not a measurement)."]
    return "\n".join(lines) + "\n"


CSV_HEADER = ["model", "target", "batch", "relation", "limit", "pair_from", "pair_to", "factor", "run", "run_status",
              "projected", "projected_status"]


def csv_rows(projections):
    return [[p.shape, p.target, p.batch, p.relation, f"{p.limit:g}", f"{p.pair_from:.6g}", f"{p.pair_to:.6g}",
             f"{p.factor:.6g}", f"{p.run:.6g}", "met" if p.run_met else "missed", f"{p.projected:.6g}",
             "met" if p.projected_met else "missed"] for p in projections]
