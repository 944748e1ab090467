"""The report writer on fake benchmark outputs: markdown, images, README section."""

from __future__ import annotations

import json
import math
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import pytest

from benchmarks.evidence import CLAIMS_FILE, ClaimRow, RatioInterval, write_claims
from benchmarks.report import (
    FULL_MODE_TIME,
    README_END,
    README_START,
    BenchmarkRun,
    Confirmation,
    claim_table,
    discover_benchmarks,
    duration_text,
    embed_summary,
    hand_written,
    heading_anchor,
    load_confirmations,
    replace_readme_section,
    section_title,
    write_report,
)

NOW = datetime(2026, 1, 2, tzinfo=timezone.utc)
PNG = b"\x89PNG fake"


def fake_run(root: Path, name: str, summary: str | None) -> BenchmarkRun:
    """A benchmark output folder holding ``summary`` and one plot."""
    run = BenchmarkRun(name, root / name, seconds=1.5)
    run.output_dir.mkdir(parents=True)
    if summary is not None:
        (run.output_dir / "summary.md").write_text(summary)
    (run.output_dir / "curve.png").write_bytes(PNG)
    return run


def claim_row(
    interval: RatioInterval,
    direction: str = "below",
    method: str = "isfedavg",
    *,
    main: bool = False,
    seeds: int | None = None,
) -> ClaimRow:
    """A claim that ``method`` needs fewer rounds than FedAvg."""
    return ClaimRow(
        paper="Rizk et al., ICASSP 2021",
        claim="ISFedAvg needs fewer rounds than FedAvg",
        comparison="matched",
        method=method,
        baseline="fedavg",
        statistic="rounds to target",
        direction=direction,  # type: ignore[arg-type]
        interval=interval,
        data="synthetic logistic regression",
        main=main,
        seeds=seeds,
    )


def mechanism_row() -> ClaimRow:
    """A row of the mechanism benchmark: OCS's aggregate error against uniform."""
    return ClaimRow(
        paper="Chen et al. 2022",
        claim="OCS lowers the aggregate's error",
        comparison="mechanism, rounds 1, 8, 15",
        method="ocs",
        baseline="uniform",
        statistic="aggregate MSE vs full participation",
        direction="below",
        interval=RatioInterval(
            0.41, 0.38, 0.44, p_value=0.0005, detectable_effect=0.04
        ),
        data="digits, log-normal sizes",
    )


@pytest.fixture
def report(tmp_path: Path) -> tuple[Path, Path, Path]:
    """The fake report written under ``tmp_path``."""
    return write_fake_report(tmp_path)


def write_fake_report(tmp_path: Path) -> tuple[Path, Path, Path]:
    """Fake outputs of a convergence and a timing benchmark, written as a report."""
    root = tmp_path / "outputs"
    runs = [
        fake_run(
            root,
            "isfedavg",
            "# ISFedAvg benchmark\n\n| method | msd |\n|---|---|\n| fedavg | 0.5 |\n\n"
            "Ours: honest line.\n\n![regression](curve.png)\n",
        ),
        fake_run(
            root, "server_overhead", "# Server overhead\n\n```\n# not a heading\n```\n"
        ),
        fake_run(root, "broken", None),
        fake_run(root, "mechanism", "# Mechanism\n"),
    ]
    write_claims(
        root / "isfedavg" / CLAIMS_FILE,
        [
            claim_row(
                RatioInterval(0.62, 0.5, 0.8, p_value=0.001, detectable_effect=0.15),
                main=True,
                seeds=9,
            ),
            claim_row(
                RatioInterval(
                    0.9, 0.0, 1.1, "upper bound", p_value=0.4, detectable_effect=0.6
                ),
                method="uniform",
                seeds=5,
            ),
        ],
    )
    write_claims(root / "mechanism" / CLAIMS_FILE, [mechanism_row()])
    confirmations = [
        Confirmation(
            "FOLB",
            "folb-synthetic-1-1",
            3,
            {"round": 3.0, "accuracy": 0.61, "loss": 1.2},
            {"round": 3.0, "accuracy": 0.6, "loss": 1.25},
            {"in-process": 2.0, "flwr run": 20.0},
        ),
        Confirmation(
            "OCS", "ocs-digits-lognormal", 3, {"accuracy": 0.7}, None, {}, "timed out"
        ),
    ]
    docs, readme = tmp_path / "docs", tmp_path / "README.md"
    (docs / "results").mkdir(parents=True)
    (docs / "results" / "stale.png").write_bytes(PNG)
    readme.write_text(
        f"# T\n\n## Results\n{README_START}\nold\n{README_END}\n\n## After\n"
    )
    write_report(
        runs,
        confirmations,
        mode="quick",
        docs_dir=docs,
        readme=readme,
        duration=duration_text(750.0, ["clustered"]),
        now=NOW,
    )
    return docs / "results.md", docs / "results", readme


def test_results_markdown_holds_sections_header_and_rewritten_images(
    report: tuple[Path, Path, Path],
) -> None:
    results, images, _ = report
    text = results.read_text()
    assert "Measured on 2026-01-02 (quick mode) with flwr " in text
    assert "`python -m benchmarks.report --full` runs the papers' rounds" in text
    assert FULL_MODE_TIME in text
    assert "Python " in text and "cores" in text
    # The convergence section comes before the timing section, which holds
    # the timing benchmark only.
    convergence = text.index("## Convergence")
    timings = text.index("## Timings (vary")
    assert convergence < text.index("#### ISFedAvg benchmark") < timings
    assert timings < text.index("#### Server overhead")
    assert "# not a heading" in text and "#### not a heading" not in text
    assert "![regression](results/isfedavg-curve.png)" in text
    assert "Ours: honest line." in text
    assert "No summary.md (exit status 0)" in text
    assert (
        "| FOLB | `folb-synthetic-1-1` | 3 | accuracy 0.61, loss 1.2 | "
        "accuracy 0.6, loss 1.25 |" in text
    )
    assert "n/a (timed out)" in text
    assert sorted(path.name for path in images.iterdir()) == [
        "broken-curve.png",
        "isfedavg-curve.png",
        "mechanism-curve.png",
        "server_overhead-curve.png",
    ]


def test_readme_section_is_replaced_between_the_markers_only(
    report: tuple[Path, Path, Path],
) -> None:
    _, _, readme = report
    text = readme.read_text()
    assert text.startswith("# T\n\n## Results\n" + README_START + "\n")
    assert text.endswith(README_END + "\n\n## After\n")
    section = text.split(README_START)[1].split(README_END)[0]
    assert "\nold\n" not in section
    assert "[docs/results.md](docs/results.md)" in section
    assert "Measured on 2026-01-02" in section
    assert (
        "This report took 12.5 min (reusing earlier outputs of clustered)." in section
    )


def test_same_inputs_give_the_same_report(
    report: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    again = write_fake_report(tmp_path / "again")
    for first, second in zip(report, again, strict=True):
        if first.is_file():
            assert first.read_text() == second.read_text()
    # Replacing the section again keeps one pair of markers.
    readme = report[2].read_text()
    replaced = replace_readme_section(replace_readme_section(readme, "y"), "x")
    assert replaced == replace_readme_section(readme, "x")
    assert replaced.count(README_START) == replaced.count(README_END) == 1


@pytest.mark.parametrize(
    "readme",
    [
        "no markers",
        f"{README_START} only the start",
        f"{README_END} end first {README_START}",
        f"{README_START}{README_START}{README_END}",
    ],
)
def test_missing_or_misplaced_markers_fail_clearly(readme: str) -> None:
    with pytest.raises(ValueError, match="results"):
        replace_readme_section(readme, "section")


def test_headings_move_down_and_images_get_the_benchmark_prefix() -> None:
    summary = "# A\n## B\ntext # not heading\n![p](plot.png) ![q](sub/q.png)\n"
    assert embed_summary("bench", summary, "results/", depth=2) == (
        "### A\n#### B\ntext # not heading\n"
        "![p](results/bench-plot.png) ![q](results/bench-q.png)\n"
    )


def test_discovery_finds_modules_with_main_argv_only(tmp_path: Path) -> None:
    (tmp_path / "good.py").write_text("def main(argv=None):\n    pass\n")
    (tmp_path / "no_argv.py").write_text("def main():\n    pass\n")
    (tmp_path / "harness.py").write_text("def main(argv=None):\n    pass\n")
    (tmp_path / "report.py").write_text("def main(argv=None):\n    pass\n")
    assert discover_benchmarks(tmp_path) == ["good"]
    assert {"server_overhead", "client_overhead", "isfedavg", "folb"} <= set(
        discover_benchmarks()
    )


def test_saved_confirmations_load_back(tmp_path: Path) -> None:
    confirmation = Confirmation(
        "FOLB", "folb-synthetic-1-1", 3, {"accuracy": 0.5}, None, {"flwr run": 2.0}
    )
    path = tmp_path / "saved.json"
    path.write_text(json.dumps([asdict(confirmation)]))
    assert load_confirmations(path) == [confirmation]
    assert load_confirmations(tmp_path / "missing.json") == []


CLAIM_LINE = (
    "| ISFedAvg needs fewer rounds than FedAvg (Rizk et al., ICASSP 2021) | "
    "**claim, 2 rows** |  |  |  | **as the paper** | synthetic logistic regression | "
)
MAIN_ROW_LINE = (
    "|  | *matched*: isfedavg / fedavg, rounds to target (main row), 9 seeds | "
    "0.62 [0.50, 0.80] | 15% | 0.001 (holds after Holm) | as the paper |  |  |"
)


def test_the_claim_table_opens_the_results_and_the_readme(
    report: tuple[Path, Path, Path],
) -> None:
    results, _, readme = report
    text = results.read_text()
    anchor = heading_anchor(section_title("isfedavg"))
    assert anchor == "isfedavg-vs-fedavg-rizk-et-al-icassp-2021"
    assert f"\n### {section_title('isfedavg')}\n" in text
    claims = text.index("## Paper claims against our measurements")
    assert claims < text.index("## Convergence")
    assert CLAIM_LINE + f"[isfedavg](#{anchor}) |" in text
    assert MAIN_ROW_LINE in text
    assert (
        "|  | *matched*: uniform / fedavg, rounds to target, 5 seeds | "
        "≤ 0.90 [0.00, 1.10] | 60% | 0.4 | inconclusive |  |  |" in text
    )
    section = readme.read_text().split(README_START)[1]
    # One line per claim: its Holm verdict and its main row, never the others.
    assert (
        "| ISFedAvg needs fewer rounds than FedAvg | **as the paper** | isfedavg / "
        "fedavg, rounds to target: 0.62 [0.50, 0.80] | "
        f"[isfedavg](docs/results.md#{anchor}) |" in section
    )
    assert "0.90" not in section
    assert section.index("| mechanism: OCS lowers") < section.index("| ISFedAvg needs")


def test_the_mechanism_rows_open_the_results_before_the_claims(
    report: tuple[Path, Path, Path],
) -> None:
    text = report[0].read_text()
    mechanism = text.index("## The mechanism: each sampler's aggregate error")
    row = text.index(
        "| OCS lowers the aggregate's error | *mechanism, rounds 1, 8, 15*: ocs / "
        "uniform, aggregate MSE vs full participation | 0.41 [0.38, 0.44] | 4% | "
        "< 0.001 | as the paper |"
    )
    assert mechanism < row < text.index("## Paper claims against our measurements")
    # Not a claim row as well.
    assert text.count("OCS lowers the aggregate's error |") == 1


def test_each_paper_gets_a_generated_paragraph_from_its_rows(
    report: tuple[Path, Path, Path],
) -> None:
    text = report[0].read_text()
    paragraphs = text.split("### What each method did here")[1]
    assert (
        "**Rizk et al., ICASSP 2021.** Claim verdicts: ISFedAvg needs fewer rounds "
        "than FedAvg: *as the paper*. The paper's effect showed in *matched*: "
        "isfedavg / fedavg, rounds to target, 38% lower (0.62 [0.50, 0.80]). "
        "Undecided: 1 row (detectable effects 60%)."
    ) in paragraphs
    assert "**The mechanism.** ocs / uniform" in paragraphs


def test_hand_written_text_is_what_lies_outside_the_generated_blocks() -> None:
    text = (
        "Intro 0.5 [0.1, 0.9].\n<!-- results:start -->\n0.62 [0.50, 0.80]\n"
        "<!-- results:end -->\nMiddle.\n<!-- generated:summary:start -->x"
        "<!-- generated:summary:end -->\n<!-- other:start -->unclosed"
    )
    assert hand_written(text) == (
        "Intro 0.5 [0.1, 0.9].\n\nMiddle.\n\n<!-- other:start -->unclosed"
    )


@pytest.mark.parametrize("direction", ["below", "above"])
@pytest.mark.parametrize(
    ("low", "high"), [(0.5, 1.0), (1.0, 1.0), (1.0, 2.5), (0.0, math.inf), (0.9, 1.1)]
)
def test_a_claim_whose_interval_holds_1_never_reads_as_the_paper(
    tmp_path: Path, low: float, high: float, direction: str
) -> None:
    run = BenchmarkRun("isfedavg", tmp_path / "isfedavg")
    run.output_dir.mkdir()
    # A claims.json whose verdict says otherwise: the table reads the interval.
    item = claim_row(RatioInterval(1.0, low, high), direction).to_json()
    (run.output_dir / CLAIMS_FILE).write_text(
        json.dumps([{**item, "verdict": "as the paper"}])
    )
    table = claim_table([run], results_link="")
    assert "as the paper" not in table
    reach = max(1 - low, high - 1)
    expected = f"no effect larger than {reach:.0%}" if reach <= 0.2 else "inconclusive"
    assert f"| {expected} |" in table


def test_no_claims_say_so() -> None:
    assert claim_table([], results_link="") == (
        "No benchmark wrote claim rows (`claims.json`)."
    )


def test_convergence_benchmarks_run_two_at_a_time_and_timings_alone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import threading
    import time

    from benchmarks import report

    running: set[str] = set()
    overlaps: dict[str, set[str]] = {}
    most_at_once = [0]
    lock = threading.Lock()

    def fake(name: str, output_root: Path, full: bool) -> BenchmarkRun:
        with lock:
            overlaps[name] = set(running)
            running.add(name)
            most_at_once[0] = max(most_at_once[0], len(running))
            for other in running - {name}:
                overlaps[other].add(name)
        time.sleep(0.05)
        with lock:
            running.discard(name)
        return BenchmarkRun(name, output_root / name, seconds=0.05)

    monkeypatch.setattr(report, "run_benchmark", fake)
    names = ["clustered", "folb", "power_of_choice", "isfedavg", "server_overhead"]
    runs = report.run_benchmarks(names, tmp_path, full=False)
    assert sorted(runs) == sorted(names)
    assert not report.paired("server_overhead") and not report.paired("isfedavg")
    # The timing and the multi-process benchmarks shared the machine with none.
    assert overlaps["server_overhead"] == set() and overlaps["isfedavg"] == set()
    # Convergence benchmarks did, never more than two at once.
    assert any(overlaps[name] for name in ("clustered", "folb", "power_of_choice"))
    assert most_at_once[0] == report.PAIRED_WORKERS
