"""Run every benchmark and write ``docs/results.md`` and the README's results.

    python -m benchmarks.report            # quick settings (< 30 min on 2 cores)
    python -m benchmarks.report --full     # paper-scale settings (about a day)

Quick mode gives each claim's main row the seeds it needs to detect a 20%
effect (up to its benchmark's cap) and the other rows their benchmark's
reported seeds; ``--full`` runs the papers' rounds and local work and powers
every row. Its time is an estimate (:data:`FULL_MODE_TIME`), from quick-mode
run times scaled by rounds, local work and seeds: FOLB at the presets' 200
rounds and ``E = 20`` takes most of it.

Steps:

1. every module of ``benchmarks/`` with a ``main(argv)`` (this one, the harness
   and the package aside) runs in its own process as
   ``python -m benchmarks.<name> [--full] --output-dir outputs/benchmarks/<name>``;
   its output goes to ``log.txt`` there, its ``summary.md`` into the report.
   The convergence benchmarks that run in one process go two at a time (their
   numbers depend on seeds only), longest first; the timings, and the
   benchmarks that run their seeds on both cores themselves, run alone;
2. each method's headline preset runs once through a real ``flwr run``
   (:func:`flwr_importance.tooling.launcher.flwr_run`, a few rounds) and once in process
   with the same run config, side by side, two presets at a time;
3. ``docs/results.md`` is written: a header (date, versions, machine), the
   claim table (every benchmark's ``claims.json`` rows, see
   :mod:`benchmarks.evidence`), the convergence results (the same for the
   same seeds), the ``flwr run`` confirmation, then the timings (which vary)
   in their own section; the PNGs are copied to ``docs/results/``;
4. the README's text between ``<!-- results:start -->`` and
   ``<!-- results:end -->`` is regenerated from the same numbers: one line per
   claim, its verdict and its main row.
"""

from __future__ import annotations

import ast
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks import main_pair
from benchmarks.evidence import (
    CLAIMS_FILE,
    NO_EFFECT,
    ClaimRow,
    claim_verdict,
    effect_text,
    holm_survivors,
    p_value_text,
    read_claims,
)
from benchmarks.harness import benchmark_parser, markdown_table
from flwr_importance.registry import methods
from simulations.tooling import declaration

REPO_ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_DIR = REPO_ROOT / "benchmarks"
NOT_BENCHMARKS = {"__init__", "harness", "report"}
#: Benchmarks only ``--full`` runs: ``main_pair`` re-measures why ``make run``
#: compares the pair it does (by its stated rule, which quick mode prints
#: too), not a paper's claim, and would cost quick mode minutes of its budget.
FULL_ONLY_BENCHMARKS = ("main_pair",)
#: Benchmarks whose tables are timings: they go to the timing section.
TIMING_BENCHMARKS = (
    "server_overhead",
    "client_overhead",
    "sampling_overhead",
    "per_sample_grads",
    "load",
    "import_time",
    "deployment_overhead",
    "secure_aggregation",
)
#: Benchmarks that run seeds in worker processes of their own (both cores):
#: they run alone, as the timings do.
MULTIPROCESS_BENCHMARKS = ("isfedavg", "mechanism")
#: The others (convergence in one process each) run two at a time on the two
#: cores: their numbers depend on seeds only, never on timing.
PAIRED_WORKERS = 2
README_START = "<!-- results:start -->"
README_END = "<!-- results:end -->"
#: Any generated block in a hand-written file: ``<!-- NAME:start -->`` to
#: ``<!-- NAME:end -->`` (the README's results are one).
GENERATED_BLOCK = re.compile(
    r"<!-- (?P<name>[\w:.-]+):start -->.*?<!-- (?P=name):end -->", re.DOTALL
)
#: How long ``--full`` takes, estimated (module docstring); the report says it.
FULL_MODE_TIME = (
    "about a day on 2 cores (estimated from quick-mode run times: FOLB at 200 "
    "rounds and E = 20 about 20 hours, the other benchmarks about 4 hours)"
)
#: The benchmark whose rows measure the mechanism directly; they open the
#: report, before the claims.
MECHANISM_BENCHMARK = "mechanism"
#: What the statistic of a mechanism row names (lower case).
MECHANISM_STATISTIC = "aggregate"
#: Per method (its strategy class name), the preset of its paper's headline
#: experiment (``flwr run`` check).
HEADLINE_PRESETS = {
    spec.strategy.__name__: declaration(spec.name).headline_preset for spec in methods()
}
FLWR_RUN_TIMEOUT = 300.0
CONFIRMATIONS_FILE = "flwr_run_confirmations.json"
#: Where a benchmark's run time is kept, to order the next report's runs.
SECONDS_FILE = "seconds.txt"
#: Where the output root keeps the time of the last report that reused nothing.
WHOLE_RUN_FILE = "report-seconds.txt"
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+\.png)\)")
HEADING = re.compile(r"^(#+) ")


@dataclass
class BenchmarkRun:
    """One benchmark's run: where its outputs are and how it went."""

    name: str
    output_dir: Path
    #: None: not run by this report, its earlier outputs reused (``--only``).
    seconds: float | None = None
    returncode: int = 0

    @property
    def summary(self) -> str | None:
        """Its ``summary.md``, if it wrote one."""
        path = self.output_dir / "summary.md"
        return path.read_text() if path.is_file() else None

    @property
    def claims(self) -> list[ClaimRow]:
        """Its claim rows (``claims.json``), none if it wrote none."""
        return read_claims(self.output_dir / CLAIMS_FILE)


@dataclass
class Confirmation:
    """A headline preset run through ``flwr run`` and in process."""

    method: str
    preset: str
    rounds: int
    in_process: Mapping[str, float] | None
    flwr_run: Mapping[str, float] | None
    seconds: dict[str, float] = field(default_factory=dict)
    error: str | None = None


def discover_benchmarks(directory: Path = BENCHMARKS_DIR) -> list[str]:
    """Modules of ``directory`` that define ``main(argv...)``, sorted by name.

    Read with :mod:`ast`, so nothing is imported (a benchmark's imports and
    set-up happen in its own process).
    """
    names = []
    for path in sorted(directory.glob("*.py")):
        if path.stem in NOT_BENCHMARKS:
            continue
        tree = ast.parse(path.read_text())
        for node in tree.body:
            if (
                isinstance(node, ast.FunctionDef)
                and node.name == "main"
                and [arg.arg for arg in node.args.args][:1] == ["argv"]
            ):
                names.append(path.stem)
    return names


def run_benchmark(name: str, output_root: Path, full: bool) -> BenchmarkRun:
    """``python -m benchmarks.<name>`` in its own process, output to ``log.txt``."""
    run = BenchmarkRun(name, output_root / name)
    run.output_dir.mkdir(parents=True, exist_ok=True)
    # A stale summary or claim must not pass for this run's.
    for stale in ("summary.md", CLAIMS_FILE):
        (run.output_dir / stale).unlink(missing_ok=True)
    command = [sys.executable, "-m", f"benchmarks.{name}"]
    command += ["--full"] if full else []
    command += ["--output-dir", str(run.output_dir)]
    start = time.perf_counter()
    with (run.output_dir / "log.txt").open("w") as log_file:
        completed = subprocess.run(
            command, cwd=REPO_ROOT, stdout=log_file, stderr=subprocess.STDOUT
        )
    run.seconds = time.perf_counter() - start
    run.returncode = completed.returncode
    (run.output_dir / SECONDS_FILE).write_text(f"{run.seconds:.1f}\n")
    print(f"{name}: {run.seconds:.0f} s, exit status {run.returncode}", flush=True)
    return run


def paired(name: str) -> bool:
    """Whether benchmark ``name`` may share the machine with another one.

    Timings need the machine to themselves, and so do the benchmarks that
    already run their seeds on both cores.
    """
    return name not in TIMING_BENCHMARKS and name not in MULTIPROCESS_BENCHMARKS


def last_seconds(name: str, output_root: Path) -> float:
    """How long benchmark ``name`` took when it last ran here (inf: unknown)."""
    path = output_root / name / SECONDS_FILE
    return float(path.read_text()) if path.is_file() else float("inf")


def last_whole_run(output_root: Path) -> float | None:
    """Seconds of the last report here that ran every step, if one did."""
    path = output_root / WHOLE_RUN_FILE
    return float(path.read_text()) if path.is_file() else None


def run_benchmarks(
    names: Sequence[str], output_root: Path, full: bool
) -> dict[str, BenchmarkRun]:
    """Run ``names``: the :func:`paired` ones two at a time, then the rest alone.

    The paired ones start longest first (by their last run here), so that the
    two workers finish close together.
    """
    shared = sorted(
        (name for name in names if paired(name)),
        key=lambda name: -last_seconds(name, output_root),
    )
    with ThreadPoolExecutor(max_workers=PAIRED_WORKERS) as pool:
        runs = dict(
            zip(
                shared,
                pool.map(lambda name: run_benchmark(name, output_root, full), shared),
                strict=True,
            )
        )
    for name in names:
        if name not in runs:
            runs[name] = run_benchmark(name, output_root, full)
    return runs


def final_metrics(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The last evaluated round's numbers (round, accuracy, loss, msd...).

    Entries that are not numbers (FedSampling's ``privacy-ledger``) are left out.
    """
    return {
        key: float(value)
        for key, value in rows[-1].items()
        if isinstance(value, int | float)
    }


def confirm_headline(
    method: str, preset: str, rounds: int, work_dir: Path
) -> Confirmation:
    """Run ``preset`` for ``rounds`` rounds through ``flwr run`` and in process."""
    # Imported here: the report's other steps need neither Flower nor torch.
    from flwr_importance.tooling.launcher import (
        ONE_CPU_PER_CLIENTAPP,
        flwr_run,
        processes_mentioning,
    )
    from simulations.inprocess import APP_DIR, load_preset, run_inprocess

    overrides = {**load_preset(preset), "num-server-rounds": rounds}
    confirmation = Confirmation(method, preset, rounds, None, None)
    start = time.perf_counter()
    rows, _ = run_inprocess(
        {**overrides, "output-dir": str(work_dir / f"{preset}-inprocess")}
    )
    confirmation.seconds["in-process"] = time.perf_counter() - start
    confirmation.in_process = final_metrics(rows)
    print(f"{preset} in process: {format_metrics(confirmation.in_process)}")
    output_dir = work_dir / f"{preset}-flwr-run"
    flwr_home = work_dir / f"{preset}-flwr-home"
    start = time.perf_counter()
    try:
        completed = flwr_run(
            APP_DIR,
            run_config={**overrides, "output-dir": str(output_dir)},
            flwr_home=flwr_home,
            capture=True,
            timeout=FLWR_RUN_TIMEOUT,
            federation_config=ONE_CPU_PER_CLIENTAPP,
        )
    except subprocess.TimeoutExpired:
        confirmation.error = f"flwr run timed out after {FLWR_RUN_TIMEOUT:.0f} s"
        return confirmation
    finally:
        confirmation.seconds["flwr run"] = time.perf_counter() - start
        left = processes_mentioning(str(flwr_home.resolve()))
        if left:
            confirmation.error = f"processes left running: {left}"
    history = output_dir / "history.json"
    if completed.returncode != 0 or not history.is_file():
        tail = (completed.stdout + completed.stderr)[-300:].replace("\n", " ")
        confirmation.error = f"flwr run failed ({completed.returncode}): {tail}"
        return confirmation
    confirmation.flwr_run = final_metrics(json.loads(history.read_text()))
    print(f"{preset} flwr run: {format_metrics(confirmation.flwr_run)}", flush=True)
    return confirmation


def load_confirmations(path: Path) -> list[Confirmation]:
    """Confirmations saved by an earlier report (none if there is no file)."""
    if not path.is_file():
        return []
    return [Confirmation(**item) for item in json.loads(path.read_text())]


# -- markdown ----------------------------------------------------------------
def embed_summary(name: str, summary: str, image_prefix: str, depth: int) -> str:
    """A benchmark's summary under the report's headings.

    Headings move down by ``depth`` levels (outside code fences) and image
    links ``![a](x.png)`` become ``![a](<image_prefix><name>-x.png)``, the
    names :func:`copy_images` gives the copies.
    """
    lines, fenced = [], False
    for line in summary.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            line = HEADING.sub(lambda m: "#" * (len(m.group(1)) + depth) + " ", line)
            line = IMAGE.sub(
                lambda m: (
                    f"![{m.group(1)}]({image_prefix}{name}-{Path(m.group(2)).name})"
                ),
                line,
            )
        lines.append(line)
    return "\n".join(lines).strip() + "\n"


def copy_images(runs: Sequence[BenchmarkRun], images_dir: Path) -> list[Path]:
    """Copy each run's PNGs to ``images_dir`` as ``<name>-<file>.png``.

    ``images_dir`` is emptied of PNGs first, so no stale plot survives.
    """
    images_dir.mkdir(parents=True, exist_ok=True)
    for old in images_dir.glob("*.png"):
        old.unlink()
    copied = []
    for run in runs:
        for png in sorted(run.output_dir.glob("*.png")):
            target = images_dir / f"{run.name}-{png.name}"
            shutil.copyfile(png, target)
            copied.append(target)
    return copied


def machine_header(mode: str, now: datetime | None = None) -> str:
    """Date, versions (flwr, torch, numpy, python) and machine (CPU, cores)."""
    now = now or datetime.now(timezone.utc)
    versions = ", ".join(
        f"{package} {metadata.version(package)}"
        for package in ("flwr", "torch", "numpy")
    )
    return (
        f"Measured on {now:%Y-%m-%d} ({mode} mode) with {versions}, "
        f"Python {platform.python_version()}, on {cpu_model()} "
        f"({os.cpu_count()} cores, {platform.system()} {platform.machine()})."
    )


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's guess."""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def format_metrics(metrics: Mapping[str, float] | None) -> str:
    """``accuracy 0.9, loss 0.3`` for the metrics a history row holds."""
    if metrics is None:
        return "n/a"
    return ", ".join(
        f"{key} {metrics[key]:.4g}"
        for key in ("accuracy", "loss", "msd")
        if key in metrics
    )


def confirmation_table(confirmations: Sequence[Confirmation]) -> str:
    """In-process against ``flwr run`` numbers of each headline preset."""
    lines = [
        "| method | preset | rounds | in process (InProcessGrid) | `flwr run` "
        "(simulation engine) |",
        "|---|---|---|---|---|",
    ]
    for item in confirmations:
        flwr_numbers = format_metrics(item.flwr_run)
        if item.error:
            flwr_numbers += f" ({item.error})"
        lines.append(
            f"| {item.method} | `{item.preset}` | {item.rounds} | "
            f"{format_metrics(item.in_process)} | {flwr_numbers} |"
        )
    return "\n".join(lines)


def duration_text(
    seconds: float, reused: Sequence[str], whole_run: float | None = None
) -> str:
    """The line ``This report took 12.5 min``, naming the steps it reused, if any.

    ``whole_run``: the seconds of the last report here that reused nothing
    (:data:`WHOLE_RUN_FILE`), said alongside when this one reused outputs.

    Examples
    --------
    >>> duration_text(750.0, [])
    'This report took 12.5 min.'
    >>> duration_text(60.0, ["folb"], whole_run=1500.0)[-51:]
    'the last report that ran every step took 25.0 min).'
    """
    text = f"This report took {seconds / 60:.1f} min"
    if reused:
        text += f" (reusing earlier outputs of {', '.join(reused)}"
        if whole_run is not None:
            text += (
                f"; the last report that ran every step took {whole_run / 60:.1f} min"
            )
        text += ")"
    return text + "."


def runs_table(
    runs: Sequence[BenchmarkRun], confirmations: Sequence[Confirmation]
) -> str:
    """Wall time of every step of this report."""
    lines = ["| step | seconds | exit status |", "|---|---|---|"]
    for run in runs:
        wall = "earlier run reused" if run.seconds is None else f"{run.seconds:.0f}"
        lines.append(
            f"| `python -m benchmarks.{run.name}` | {wall} | {run.returncode} |"
        )
    for item in confirmations:
        for where, seconds in item.seconds.items():
            lines.append(f"| `{item.preset}`, {where} | {seconds:.0f} | |")
    return "\n".join(lines)


def section_title(name: str, directory: Path = BENCHMARKS_DIR) -> str:
    """The heading of benchmark ``name``'s section in ``docs/results.md``.

    The benchmark module's own ``TITLE`` string, read with :mod:`ast` as
    :func:`discover_benchmarks` reads it; without one, the module's path.
    """
    path = directory / f"{name}.py"
    for node in ast.parse(path.read_text()).body if path.is_file() else []:
        if (
            isinstance(node, ast.Assign)
            and [getattr(target, "id", None) for target in node.targets] == ["TITLE"]
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            return node.value.value
    return f"`benchmarks/{name}.py`"


def heading_anchor(heading: str) -> str:
    """The anchor GitHub gives a markdown heading.

    Lower case, punctuation dropped, spaces as hyphens: ``"A/B vs C (D, 2021)"``
    links as ``#ab-vs-c-d-2021``.
    """
    kept = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return kept.replace(" ", "-")


def _section_link(run: BenchmarkRun, results_link: str) -> str:
    """``[name](results.md#anchor)``: the link to a benchmark's section."""
    return f"[{run.name}]({results_link}#{heading_anchor(section_title(run.name))})"


def mechanism_rows(runs: Sequence[BenchmarkRun]) -> list[ClaimRow]:
    """The rows of the mechanism benchmark whose statistic is the aggregate's error.

    Those are the claim rows of :data:`MECHANISM_BENCHMARK` whose statistic
    names the aggregate (``"aggregate MSE vs full participation"``); none if
    it did not run.
    """
    return [row for run in runs for row in run.claims if _is_mechanism_row(run, row)]


def _is_mechanism_row(run: BenchmarkRun, row: ClaimRow) -> bool:
    """Whether ``row`` of ``run`` measures the aggregate's error directly."""
    return (
        run.name == MECHANISM_BENCHMARK and MECHANISM_STATISTIC in row.statistic.lower()
    )


def _claims(run: BenchmarkRun) -> list[list[ClaimRow]]:
    """A benchmark's claim rows grouped by claim, in order; no mechanism rows."""
    groups: dict[tuple[str, str], list[ClaimRow]] = {}
    for row in run.claims:
        if not _is_mechanism_row(run, row):
            groups.setdefault((row.paper, row.claim), []).append(row)
    return list(groups.values())


def _row_cells(row: ClaimRow, survived: bool | None) -> list[str]:
    """A row's comparison, interval, detectable effect, p-value and verdict."""
    marks = " (main row)" if row.main else ""
    seeds = "" if row.seeds is None else f", {row.seeds} seeds"
    p_value = p_value_text(row.p_value)
    if survived:
        p_value += " (holds after Holm)"
    return [
        f"*{row.comparison}*: {row.method} / {row.baseline}, {row.statistic}"
        f"{marks}{seeds}",
        row.interval.text(),
        effect_text(row.detectable_effect),
        p_value,
        row.verdict,
    ]


def claim_table(runs: Sequence[BenchmarkRun], results_link: str) -> str:
    """Per paper claim of every benchmark its verdict, then its rows, linked.

    Parameters
    ----------
    runs : Sequence[BenchmarkRun]
        The benchmarks, in report order; each contributes its ``claims.json``
        (the mechanism rows aside: :func:`mechanism_table`).
    results_link : str
        The path of ``docs/results.md`` from where the table is read (empty
        within it).

    Returns
    -------
    str
        A markdown table, or a line saying no benchmark wrote claims. Each
        claim's first line gives its verdict (:func:`claim_verdict`, Holm's
        step-down over its rows), each row below it its own; all recomputed
        from the intervals and p-values, never copied.
    """
    rows = []
    for run in runs:
        for claim in _claims(run):
            first = claim[0]
            survivors = holm_survivors([row.p_value for row in claim])
            rows.append(
                [
                    f"{first.claim} ({first.paper})",
                    f"**claim, {len(claim)} rows**",
                    "",
                    "",
                    "",
                    f"**{claim_verdict(claim)}**",
                    first.data,
                    _section_link(run, results_link),
                ]
            )
            for row, survived in zip(claim, survivors, strict=True):
                rows.append(["", *_row_cells(row, survived), "", ""])
    if not rows:
        return "No benchmark wrote claim rows (`claims.json`)."
    return markdown_table(
        [
            "claim",
            "comparison",
            "our ratio [95% interval]",
            "detectable effect",
            "p (ratio = 1)",
            "verdict",
            "data used",
            "section",
        ],
        rows,
    )


def mechanism_table(runs: Sequence[BenchmarkRun], results_link: str) -> str:
    """The mechanism rows (:func:`mechanism_rows`), or why there are none."""
    rows = mechanism_rows(runs)
    if not rows:
        return (
            f"The `{MECHANISM_BENCHMARK}` benchmark wrote no rows "
            f"(`python -m benchmarks.{MECHANISM_BENCHMARK}`)."
        )
    run = next(run for run in runs if run.name == MECHANISM_BENCHMARK)
    return markdown_table(
        [
            "claim",
            "comparison",
            "our ratio [95% interval]",
            "detectable effect",
            "p (ratio = 1)",
            "verdict",
        ],
        [[row.claim, *_row_cells(row, None)] for row in rows],
    ) + (f"\n\nEach row's setting and data: {_section_link(run, results_link)}.")


def method_paragraphs(runs: Sequence[BenchmarkRun]) -> str:
    """One generated paragraph per paper: where its effect showed, by how much.

    From the rows alone: the rows whose p-value survives Holm's step-down
    within their claim, on the paper's side (with the change in per cent) and
    on the other; the rows that bound the effect (*no effect larger than
    X%*); and how many rows stay undecided, with their detectable effects.
    """
    papers: dict[str, list[list[ClaimRow]]] = {}
    for run in runs:
        for claim in _claims(run):
            papers.setdefault(claim[0].paper, []).append(claim)
    mechanism = mechanism_rows(runs)
    paragraphs = []
    for paper, claims in papers.items():
        showed: list[str] = []
        opposite: list[str] = []
        bounded: list[str] = []
        undecided: list[ClaimRow] = []
        for claim in claims:
            survivors = holm_survivors([row.p_value for row in claim])
            for row, survived in zip(claim, survivors, strict=True):
                if survived and row.side is not None:
                    (showed if row.side == row.direction else opposite).append(
                        _change_text(row)
                    )
                elif row.verdict.startswith(NO_EFFECT):
                    bounded.append(f"{_row_name(row)} ({row.verdict})")
                else:
                    undecided.append(row)
        sentences = [
            "Claim verdicts: "
            + "; ".join(
                f"{claim[0].claim}: *{claim_verdict(claim)}*" for claim in claims
            )
            + "."
        ]
        sentences.append(
            "The paper's effect showed in " + "; ".join(showed) + "."
            if showed
            else "The paper's effect showed in no row after Holm's correction."
        )
        if opposite:
            sentences.append("The opposite showed in " + "; ".join(opposite) + ".")
        if bounded:
            sentences.append("No effect beyond a bound: " + "; ".join(bounded) + ".")
        if undecided:
            effects = sorted(
                row.detectable_effect
                for row in undecided
                if row.detectable_effect is not None
            )
            span = " to ".join(
                dict.fromkeys(effect_text(effects[index]) for index in (0, -1))
            )
            reach = f" (detectable effects {span})" if effects else ""
            count = f"{len(undecided)} row{'s' if len(undecided) > 1 else ''}"
            sentences.append(f"Undecided: {count}{reach}.")
        paragraphs.append(f"**{paper}.** " + " ".join(sentences))
    if mechanism:
        paragraphs.append(
            "**The mechanism.** "
            + " ".join(
                f"{row.method} / {row.baseline} ({row.comparison}): "
                f"{row.interval.text()}, {row.verdict}."
                for row in mechanism
            )
        )
    return "\n\n".join(paragraphs) if paragraphs else "No claim rows to summarize."


def _row_name(row: ClaimRow) -> str:
    """``*matched*: isfedavg / fedavg, final MSD``."""
    return f"*{row.comparison}*: {row.method} / {row.baseline}, {row.statistic}"


def _change_text(row: ClaimRow) -> str:
    """A row and its change, ``<n>% lower (<ratio> [<low>, <high>])``."""
    ratio = row.interval.ratio
    change = f"{abs(1 - ratio):.0%} {'lower' if ratio < 1 else 'higher'}"
    return f"{_row_name(row)}, {change} ({row.interval.text()})"


CLAIMS_INTRO = (
    "Each claim: its verdict in bold, then its rows. A row is our ratio of "
    "medians over the seeds (method / baseline) with a paired bootstrap 95% "
    "interval; its detectable effect (the change the seeds find with 80% "
    "power at a two-sided 5% level: 2.8 bootstrap standard errors of the log "
    "ratio); its p-value for a ratio of 1 (the smallest level whose bootstrap "
    "interval excludes 1, never below 2^(1 - n) for n seeds, the least any "
    "paired sign-flip test can give); and its verdict: *as the paper* only "
    "when the "
    "interval excludes 1 (and the 1% around it that counts as no effect) on "
    "the paper's side, *unlike the paper* on the other, *no effect larger "
    "than X%* when it meets 1 and both ends lie within X <= 20% of it, "
    "*inconclusive* otherwise. The claim's verdict applies Holm's step-down at "
    "5% to its rows' p-values: *as the paper* if a row on the paper's side "
    "holds and none on the other, *unlike the paper* in the mirror case, "
    "*mixed* if both, else its tightest no-effect bound or *inconclusive*. The "
    "main row of each claim is powered in quick mode (seeds added until it "
    "detects a 20% effect and has the seeds for its p-value to pass Holm's "
    "step, or its benchmark's cap); the other rows keep their "
    "benchmark's reported seeds, which `--full` raises. A final value is the "
    "mean over the last 10% of rounds (at least 3). ≤/≥: seeds that missed the "
    "target (counted as one round past the last) make the ratio a bound."
)
MECHANISM_INTRO = (
    "The error of each sampler's aggregate against full participation, at "
    "equal expected participation, on client updates captured from the claim "
    "benchmarks' own runs: the quantity the variance-reducing samplers exist "
    "to lower, measured directly (method / baseline, 95% interval)."
)


def benchmark_section(run: BenchmarkRun, image_prefix: str) -> str:
    """A benchmark's summary under its own heading, or why it has none."""
    title = section_title(run.name)
    heading = f"### {title}\n\nFrom `python -m benchmarks.{run.name}`.\n\n"
    if run.summary is None:
        return (
            heading + f"No summary.md (exit status {run.returncode}); see "
            f"`outputs/benchmarks/{run.name}/log.txt`.\n"
        )
    return heading + embed_summary(run.name, run.summary, image_prefix, depth=3)


def render_results(
    header: str,
    runs: Sequence[BenchmarkRun],
    confirmations: Sequence[Confirmation],
    command: str,
    image_prefix: str = "results/",
) -> str:
    """The whole ``docs/results.md``."""
    results = [run for run in runs if run.name not in TIMING_BENCHMARKS]
    timings = [run for run in runs if run.name in TIMING_BENCHMARKS]
    parts = [
        "# Results",
        "",
        f"Generated by `{command}`; do not edit by hand. {header}",
        "",
        "Every convergence number below comes from the in-process grid "
        "(`flwr_importance.tooling.testing.InProcessGrid`: the real strategies and "
        "ClientApps, the same messages, no SuperLink), except the `flwr run` "
        "column of the confirmation table. The convergence tables are the same "
        "for the same seeds; the timing section varies between runs and machines.",
        "",
        "Quick mode powers each claim's main row (seeds added until it detects "
        "a 20% effect and can pass Holm's step, up to its benchmark's cap) and "
        "keeps the other rows at "
        "their benchmark's reported seeds; `python -m benchmarks.report --full` "
        "runs the papers' rounds and local work and powers every row, in "
        f"{FULL_MODE_TIME}.",
        "",
        "The pair `make run` shows comes from `python -m benchmarks.main_pair` "
        f"(its section below when the report ran with `--full`): {main_pair.RULE}",
        "",
        "## The mechanism: each sampler's aggregate error",
        "",
        MECHANISM_INTRO,
        "",
        mechanism_table(results, results_link=""),
        "",
        "## Paper claims against our measurements",
        "",
        CLAIMS_INTRO,
        "",
        claim_table(results, results_link=""),
        "",
        "### What each method did here",
        "",
        "Generated from the rows above, one paragraph per paper.",
        "",
        method_paragraphs(results),
        "",
        "## Convergence against each paper's baselines",
        "",
        *[benchmark_section(run, image_prefix) for run in results],
        "## Headline presets through `flwr run`",
        "",
        "Each method's headline preset, a few rounds, once through a real `flwr "
        "run` (Flower's simulation engine) and once in process with the same run "
        "config. The two differ in node ids (Flower draws them at random), so "
        "seeded client draws and the numbers differ somewhat: the check is that "
        "the real deployment path runs the method and learns comparably.",
        "",
        confirmation_table(confirmations),
        "",
        "## Timings (vary between runs and machines)",
        "",
        *[benchmark_section(run, image_prefix) for run in timings],
        "### This report's run",
        "",
        runs_table(runs, confirmations),
        "",
    ]
    return "\n".join(parts)


def verdict_table(runs: Sequence[BenchmarkRun], results_link: str) -> str:
    """One line per claim: its verdict (Holm's step) and its main row, linked.

    The mechanism claims come first, as in ``docs/results.md``; every row,
    detectable effect and p-value stays there.
    """
    lines = []
    for run in runs:
        mechanism = [row for row in run.claims if _is_mechanism_row(run, row)]
        groups: dict[str, list[ClaimRow]] = {}
        for row in mechanism:
            groups.setdefault(row.claim, []).append(row)
        lines += [("mechanism: " + claim, run, rows) for claim, rows in groups.items()]
    for run in runs:
        lines += [(rows[0].claim, run, rows) for rows in _claims(run)]
    if not lines:
        return "No benchmark wrote claim rows (`claims.json`)."
    return markdown_table(
        ["claim", "verdict", "main row: method / baseline, statistic", "details"],
        [
            [
                claim,
                f"**{claim_verdict(rows)}**",
                _main_row_text(next((row for row in rows if row.main), rows[0])),
                _section_link(run, results_link),
            ]
            for claim, run, rows in lines
        ],
    )


def _main_row_text(row: ClaimRow) -> str:
    """``method / baseline, statistic: ratio [interval]`` of one row."""
    return f"{row.method} / {row.baseline}, {row.statistic}: {row.interval.text()}"


def readme_section(header: str, runs: Sequence[BenchmarkRun], command: str) -> str:
    """The README's results: the header and one line per claim."""
    results = [run for run in runs if run.name not in TIMING_BENCHMARKS]
    return "\n".join(
        [
            f"Generated by `{command}`. {header}",
            "",
            verdict_table(results, results_link="docs/results.md"),
            "",
            "Every row behind each verdict, with its interval, detectable effect "
            "and p-value, the `flwr run` confirmations and the overhead timings: "
            "[docs/results.md](docs/results.md).",
        ]
    )


def hand_written(text: str) -> str:
    """``text`` without its generated blocks (:data:`GENERATED_BLOCK`).

    What remains is what a person wrote: a number in it that looks like a
    measured ratio or interval was not generated.

    Examples
    --------
    >>> hand_written("a <!-- results:start -->0.5 [0.1, 0.9]<!-- results:end --> b")
    'a  b'
    """
    return GENERATED_BLOCK.sub("", text)


def replace_readme_section(readme: str, section: str) -> str:
    """``readme`` with the text between the results markers replaced.

    Raises
    ------
    ValueError
        If either marker is missing, repeated, or the end comes first.
    """
    starts, ends = readme.count(README_START), readme.count(README_END)
    if starts != 1 or ends != 1:
        raise ValueError(
            f"README must hold {README_START!r} and {README_END!r} once each "
            f"(found {starts} and {ends}); the results section goes between them"
        )
    head, rest = readme.split(README_START)
    if README_END not in rest:
        raise ValueError(f"{README_END!r} comes before {README_START!r} in README")
    _, tail = rest.split(README_END)
    return f"{head}{README_START}\n{section.strip()}\n{README_END}{tail}"


def write_report(
    runs: Sequence[BenchmarkRun],
    confirmations: Sequence[Confirmation],
    *,
    mode: str,
    docs_dir: Path,
    readme: Path,
    duration: str = "",
    now: datetime | None = None,
) -> Path:
    """Write ``docs/results.md``, its images and the README section.

    ``duration`` (from :func:`duration_text`) follows the machine header.
    """
    command = "python -m benchmarks.report" + (" --full" if mode == "full" else "")
    header = f"{machine_header(mode, now)} {duration}".strip()
    results_path = docs_dir / "results.md"
    copy_images(runs, docs_dir / "results")
    results_path.write_text(render_results(header, runs, confirmations, command))
    section = readme_section(header, runs, command)
    readme.write_text(replace_readme_section(readme.read_text(), section))
    return results_path


def main(argv: Sequence[str] | None = None) -> None:
    """Run the benchmarks and the ``flwr run`` checks; write the report."""
    parser = benchmark_parser("report", __doc__)
    parser.set_defaults(output_dir=Path("outputs/benchmarks"))
    parser.add_argument("--docs-dir", type=Path, default=REPO_ROOT / "docs")
    parser.add_argument("--readme", type=Path, default=REPO_ROOT / "README.md")
    parser.add_argument(
        "--only",
        nargs="+",
        default=None,
        help="run only these benchmarks; the others' earlier outputs are reused",
    )
    parser.add_argument(
        "--skip-flwr-run",
        action="store_true",
        help="reuse the last saved flwr run confirmations instead of running them",
    )
    args = parser.parse_args(argv)
    # Fail now, not after the benchmarks, if the README cannot take the results.
    replace_readme_section(args.readme.read_text(), "")
    started = time.perf_counter()
    output_root: Path = args.output_dir.resolve()
    names = [
        name
        for name in discover_benchmarks()
        if args.full or name not in FULL_ONLY_BENCHMARKS
    ]
    ran = run_benchmarks(
        [name for name in names if args.only is None or name in args.only],
        output_root,
        args.full,
    )
    runs = [ran.get(name) or BenchmarkRun(name, output_root / name) for name in names]
    saved = output_root / CONFIRMATIONS_FILE
    if args.skip_flwr_run:
        confirmations = load_confirmations(saved)
    else:
        rounds = 10 if args.full else 3
        # Two at a time: each run spends most of its time starting processes.
        with (
            tempfile.TemporaryDirectory(prefix="flwr-report-") as work_dir,
            ThreadPoolExecutor(max_workers=PAIRED_WORKERS) as pool,
        ):
            confirmations = list(
                pool.map(
                    lambda method, preset: confirm_headline(
                        method, preset, rounds, Path(work_dir)
                    ),
                    HEADLINE_PRESETS.keys(),
                    HEADLINE_PRESETS.values(),
                )
            )
        saved.write_text(json.dumps([asdict(item) for item in confirmations]))
    reused = [run.name for run in runs if run.seconds is None]
    if args.skip_flwr_run:
        reused.append("the flwr run checks")
    path = write_report(
        runs,
        confirmations,
        mode="full" if args.full else "quick",
        docs_dir=args.docs_dir,
        readme=args.readme,
        duration=duration_text(
            time.perf_counter() - started, reused, last_whole_run(output_root)
        ),
    )
    if not reused:
        (output_root / WHOLE_RUN_FILE).write_text(
            f"{time.perf_counter() - started:.1f}\n"
        )
    print(f"wrote {path} and {args.readme} in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
