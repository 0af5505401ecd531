"""Check that every "yes" of the feature matrix is backed by records that stand up to `llmb verify`'s own checks.

`llmb features` trusts each record's own word (its invalid_reasons, its conformance verdicts); this does not. For
each "yes" cell it takes the result records of that combination and parallel mode and the conformance records of the
combination, and re-runs on them the per-record checks `llmb verify` runs on a bundle: the schema, every figure
recomputed from the recorded times, the step times against the window, a released model (the release named), the
losses, AdamW's fixed hyperparameters, the peak, the audit's evidence against its label, the clean-room evidence
(judged windows, the run's own replay), no cloned runs; and each conformance record's verdicts against its own
figures. A cell is backed when at least one result and one conformance record of it pass. Tiny-preset records are
debug shapes by design and FP8 is outside the benchmark precisions by design: those two findings are expected, not
failures.

    python scripts/check_feature_records.py benchmarks/features     # exit 1 if any "yes" is not backed
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from llmb import verify
from llmb.records import Conformance, RecordError, Result
from llmb.run.feature_matrix import FP8_LABEL_REASON, PARALLEL, cell, features_of, load_records, parallel_of
from llmb.spec.fingerprint import release_of
from llmb.verify import evidence_checks as bundle_evidence

PER_RESULT = [
    verify.throughput_problems,
    verify.timing_problems,
    verify.loss_problems,
    verify.optimizer_record_problems,
    verify.peak_problems,
    verify.evidence_problems,
]


def result_problems(record: dict, fp8: bool) -> list[str]:
    try:
        r = Result.from_dict(record)
    except RecordError as exc:
        return [f"schema: {exc}"]
    bundle = verify.Bundle(Path("."), accept_debug=True)
    problems = [p for check in PER_RESULT for p in check(bundle, "results/x.json", r)]
    # A released model, not necessarily today's: the matrix says which features ran on llmb, and names the model
    # release its records were made on (main() prints it), where a bundle must be of the current release.
    if release_of(r.model_fingerprint) is None:
        problems.append(f"model fingerprint {r.model_fingerprint[:12]}... is no release of llmb's model")
    # The audit's evidence against its label (filed as labelled: there is no bundle folder to check here).
    expected = {f"{r.precision.effective} is not a benchmark precision"} if fp8 else set()
    problems += [p for p in verify.precision_problems(bundle, f"results/{r.precision.effective}/x.json", r)]
    problems = [p for p in problems if p not in expected]
    allowed = {FP8_LABEL_REASON} if fp8 else set()
    problems += [f"invalid: {reason}" for reason in r.invalid_reasons if reason not in allowed]
    return problems


def conformance_problems(record: dict, fp8: bool) -> list[str]:
    try:
        Conformance.from_dict(record)
    except RecordError as exc:
        return [f"schema: {exc}"]
    problems = bundle_evidence.conformance_arithmetic(record)
    failed = {c.get("name") for c in record.get("checks", []) if not c.get("passed")}
    if failed - ({"precision"} if fp8 else set()):
        problems.append(f"failed checks {sorted(failed)}")
    return problems


@click.command()
@click.argument("folder", type=click.Path(exists=True, file_okay=False, path_type=Path))
def main(folder: Path) -> None:
    records = load_records([folder])
    clones = bundle_evidence.clone_problems((str(i), r) for i, r in enumerate(records.results))
    for problem in clones:
        click.echo(f"clone: {problem}")
    combos = sorted({features_of(r) for r in records.results + records.conformance}, key=lambda c: (len(c), sorted(c)))
    backed = unbacked = 0
    for combo in combos:
        fp8 = "fp8" in combo
        checks = [c for c in records.conformance if features_of(c) == combo]
        conforming = [c for c in checks if not conformance_problems(c, fp8)]
        for parallel in PARALLEL:
            if cell(records, combo, parallel) != "yes":
                continue
            runs = [r for r in records.results if features_of(r) == combo and parallel_of(r) == parallel]
            found = {id(r): result_problems(r, fp8) for r in runs}
            good = [r for r in runs if not found[id(r)]]
            label = f"{'+'.join(sorted(combo))} {parallel}"
            if good and conforming:
                backed += 1
                releases = ", ".join(str(n) for n in sorted({release_of(r["model_fingerprint"]) for r in good}))
                click.echo(
                    f"backed   {label}: {len(good)} result(s) (model release {releases}), "
                    f"{len(conforming)} conformance record(s) pass"
                )
            else:
                unbacked += 1
                shown = [p for r in runs for p in found[id(r)]][:3] or ["no conforming record"]
                click.echo(f"UNBACKED {label}: {'; '.join(shown)}")
    click.echo(f"{backed} yes cells backed, {unbacked} not; {len(clones)} cloned runs")
    sys.exit(1 if unbacked or clones else 0)


if __name__ == "__main__":
    main()
