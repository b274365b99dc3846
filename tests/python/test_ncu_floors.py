"""scripts/ncu_floors.py reads Nsight Compute's text reports of the decode kernels (committed from H100 runs) and
derives two floors. Each derived figure is checked against what it must agree with but was not computed from: the
issue floor's share of the duration against ncu's own issue rate (issued warps per scheduler per active cycle, times
the active share of the elapsed cycles), and the DRAM peak the floor implies against the H100 SXM's datasheet
figure (3.35 TB/s, HBM3) on the card the reports name. Reports missing what the floors need are refused by name."""
import lzma
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "python"))
from replayssm_py.ncu_floors import NcuReportError, read_launch  # noqa: E402

REPORTS = sorted((ROOT / "experiments/bench/decode_2026-12-07/session33").glob("call[56]_ncu_*/r/*_details.txt.xz"))
H100_SXM_DRAM_BYTES_PER_S = 3.35e12  # NVIDIA H100 SXM5 datasheet, HBM3


def test_the_committed_reports_are_there():
    assert len(REPORTS) >= 3, REPORTS


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: p.parent.parent.name + "/" + p.name)
def test_issue_floor_agrees_with_ncus_issue_rate(report):
    x = read_launch(report)
    ncu_issue_share = x.issued_per_scheduler * x.sm_active_cycles / x.elapsed_cycles
    assert x.issue_floor_s / x.duration_s == pytest.approx(ncu_issue_share, rel=0.02)
    # and the duration is the elapsed cycles at the SM clock
    assert x.duration_s == pytest.approx(x.elapsed_cycles / x.sm_hz, rel=0.02)


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: p.parent.parent.name + "/" + p.name)
def test_dram_floor_implies_the_cards_datasheet_peak(report):
    gpu = lzma.open(report.parent / "gpu.txt.xz", "rt").read()
    assert "H100" in gpu, gpu
    x = read_launch(report)
    assert x.dram_peak_bytes_per_s == pytest.approx(H100_SXM_DRAM_BYTES_PER_S, rel=0.02)
    assert 0 < x.dram_floor_s < x.duration_s and 0 < x.issue_floor_s < x.duration_s


def plain_copy(report, tmp_path, drop=None, replace=None):
    text = lzma.open(report, "rt").read()
    if drop:
        text = "\n".join(line for line in text.splitlines() if not line.split()[:len(drop.split())] == drop.split())
    if replace:
        assert replace[0] in text, replace[0]
        text = text.replace(*replace)
    out = tmp_path / "details.txt"
    out.write_text(text)
    return out


def test_a_report_without_the_instruction_count_is_refused_by_name(tmp_path):
    bad = plain_copy(REPORTS[0], tmp_path, drop="smsp__inst_executed.sum")
    with pytest.raises(NcuReportError, match=r"details\.txt: missing smsp__inst_executed\.sum"):
        read_launch(bad)


def test_a_metric_in_an_unexpected_unit_is_refused(tmp_path):
    bad = plain_copy(REPORTS[0], tmp_path, replace=("Registers Per Thread             register/thread",
                                                    "Registers Per Thread             register/warp  "))
    with pytest.raises(NcuReportError, match="Registers Per Thread: expected unit 'register/thread', found 'register/warp'"):
        read_launch(bad)


def test_the_cli_names_each_row_from_its_row_file(tmp_path):
    report = tmp_path / "qwen3.5-4b_3_details.txt.xz"
    report.write_bytes(REPORTS[0].read_bytes())
    (tmp_path / "qwen3.5-4b_3_row.txt").write_text("qwen3.5-4b;non-flush read nvfp4 (x over fp32 read);replay_nonflush_kernel\n")
    r = subprocess.run([sys.executable, str(ROOT / "scripts/ncu_floors.py"), str(report)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "| qwen3.5-4b: non-flush read nvfp4 (x over fp32 read) | replay_nonflush_kernel |" in r.stdout, r.stdout
    r = subprocess.run([sys.executable, str(ROOT / "scripts/ncu_floors.py"), str(tmp_path / "none.txt")],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "none.txt" in r.stderr, r.stderr
