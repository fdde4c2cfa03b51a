"""Where each run of a study ran (issue 55 item 2): every attempt's commit, machine and resume point from the run's
provenance.json, and the flags a report raises: a run resumed across machines or commits, a comparison whose
arms ran on different machine types."""

import json

MACHINE_KEYS = ("cpu", "family", "model", "avx512", "cores")  # what makes two machines one type for a comparison


def machine_type(entry: dict) -> str:
    """One attempt's machine type (MACHINE_KEYS of its recorded machine), as comparisons group them."""
    machine = entry.get("machine", {})
    return ", ".join(f"{k} {machine[k]}" for k in MACHINE_KEYS if k in machine)


def machine_types(run_dir) -> set[str] | None:
    """The machine types a run trained on (one per machine its attempts ran on), or None where the run has no
    provenance.json (trained before the study tool recorded it)."""
    path = run_dir / "provenance.json"
    if not path.is_file():
        return None
    return {machine_type(e) for e in json.loads(path.read_text(encoding="utf-8"))}


def pair_machines(run_dir, base_dir) -> str:
    """How a run and its baseline's run of the same seed shared machines: "same" (each on one machine type, the
    same one), "different", or "unrecorded" (either has no provenance.json)."""
    mine, theirs = machine_types(run_dir), machine_types(base_dir)
    if mine is None or theirs is None:
        return "unrecorded"
    return "same" if len(mine) == 1 and mine == theirs else "different"


def provenance(study, results: dict) -> dict:
    """Each run's attempts from its provenance.json (study_run.Study._record_provenance), and the flags the
    report raises: a run resumed across machines or commits, and a comparison (a run and the baseline's run of
    the same variant and seed) whose arms ran on different machine types. Runs trained before the tool recorded
    provenance are listed as unrecorded, not flagged."""
    attempts, flags, unrecorded = {}, [], []
    for run in results:
        path = study.run_dir(run) / "provenance.json"
        if not path.is_file():
            unrecorded.append(run.name)
            continue
        entries = json.loads(path.read_text(encoding="utf-8"))
        attempts[run.name] = entries
        machines = {machine_type(e) for e in entries}
        commits = {e.get("commit") for e in entries}
        if len(machines) > 1:
            flags.append(f"{run.name} resumed across machines ({'; '.join(sorted(machines))})")
        if len(commits) > 1:
            flags.append(f"{run.name} resumed across commits ({', '.join(sorted(map(str, commits)))})")
    archs = list(dict.fromkeys(run.arch for run in results))
    for run in results:
        if run.arch == archs[0] or run.name not in attempts:
            continue
        base = next((b for b in results if b.arch == archs[0] and b.variant == run.variant and b.seed == run.seed
                     and b.name in attempts), None)  # fmt: skip
        if base is None:
            continue
        mine = {machine_type(e) for e in attempts[run.name]}
        theirs = {machine_type(e) for e in attempts[base.name]}
        if mine != theirs:
            flags.append(f"{run.name} and its baseline {base.name} ran on different machines")
    return {"runs": attempts, "flags": flags, "unrecorded": unrecorded}


def provenance_section(context: dict) -> list[str]:
    """results.md's provenance: how many runs recorded it, and every flag."""
    record = context.get("provenance")
    if not record:
        return []
    total = len(record["runs"]) + len(record["unrecorded"])
    lines = ["## Provenance", "", (f"{len(record['runs'])} of {total} runs record each attempt's commit, machine and "
                                   "resume point (runs/*/provenance.json)"
                                   + (f"; {len(record['unrecorded'])} were trained before the study tool recorded it."
                                      if record["unrecorded"] else "."))]  # fmt: skip
    if record["flags"]:
        lines += ["", "Flags:", ""] + [f"- {flag}" for flag in record["flags"]]
    elif record["runs"]:
        lines += ["", "No run resumed across machines or commits, and every recorded comparison's arms ran on one machine type."]
    return lines + [""]
