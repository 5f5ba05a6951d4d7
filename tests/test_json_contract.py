"""docs/json.md is the --json contract: every key any command emits (nested objects and the objects in lists
included) must be documented there, in that command's section or a key group it includes."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from smdp_batch.cli import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "json.md"
POLICIES = Path(__file__).resolve().parent.parent / "policies"


# ------------------------------------------------------------------------------------ the document
def _sections(text: str) -> dict:
    """Section id (the first `code` of a '## ' heading) → (documented paths, [(group, prefix)] includes)."""
    sections, current = {}, None
    for line in text.splitlines():
        if line.startswith("## "):
            m = re.search(r"`([^`]+)`", line)
            current = m.group(1) if m else None
            if current:
                sections[current] = (set(), [])
        elif current and line.startswith("Includes:"):
            for group, prefix in re.findall(r"`(@[\w-]+)`(?: under `([^`]+)`)?", line):
                sections[current][1].append((group, prefix))
        elif current and line.startswith("| `"):
            first_cell = line.split("|")[1]
            sections[current][0].update(re.findall(r"`([^`]+)`", first_cell))
    return sections


def _patterns(sections: dict, name: str, prefix: str = "", seen=()) -> list[tuple]:
    """Documented paths of a section (with its includes), as tuples of regular expressions per component."""
    paths, includes = sections[name]
    out = []
    for p in paths:
        full = f"{prefix}.{p}" if prefix else p
        out.append(tuple(re.compile(re.sub(r"<[^>]+>", ".+", re.escape(c).replace(r"\<", "<").replace(r"\>", ">")) + "$")
                         for c in full.split(".")))
    for group, sub in includes:
        assert group in sections, f"docs/json.md: {name} includes unknown group {group}"
        assert group not in seen, f"docs/json.md: include cycle at {group}"
        where = ".".join(x for x in (prefix, sub) if x)
        out += _patterns(sections, group, where, seen + (group,))
    return out


def _emitted(obj, prefix=()) -> set[tuple]:
    """Every key path of a JSON value: dict keys, and the keys of objects inside lists (as 'name[]')."""
    out = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(prefix + (k,))
            if isinstance(v, list):
                for item in v:
                    out |= _emitted(item, prefix + (f"{k}[]",))
            else:
                out |= _emitted(v, prefix + (k,))
    return out


def undocumented(name: str, output: dict) -> list[str]:
    sections = _sections(DOC.read_text(encoding="utf-8"))
    assert name in sections, f"docs/json.md has no section for `{name}`"
    pats = _patterns(sections, name)

    def ok(path):
        return any(len(p) == len(path) and all(r.match(c) for r, c in zip(p, path)) for p in pats)

    return sorted(".".join(p) for p in _emitted(output) if not ok(p))


def test_the_checker_catches_an_undocumented_key():
    assert undocumented("solve", {"lam": 1.0, "s_max": 40, "truncated": {"delta": 0.1}}) == []
    assert undocumented("solve", {"smax": 40, "bank": [{"lam": 1, "bogus": 2}]}) == ["bank[].bogus", "smax"]
    assert undocumented("simulate", {"p95_ms": 1, "batch_size_counts": {"8": 3}, "within": [{"share": 1}]}) == []


# ---------------------------------------------------------------------------------- every command
def _profile(path: Path) -> str:
    rows = ["batch_size,latency_ms,energy_mj"]
    for b in (1, 2, 4, 8):
        for k in range(3):
            rows.append(f"{b},{0.2 * b + 2 + 0.01 * k:.4f},{3 * b + 10 + 0.1 * k:.4f}")
    path.write_text("\n".join(rows) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("json")
    table, bank = tmp / "t.h5", tmp / "bank.h5"
    assert main(["solve", "--bmax", "8", "-o", str(table)]) == 0
    assert main(["solve", "--bmax", "8", "--rho-grid", "0.3,0.6", "-o", str(bank)]) == 0
    trace = tmp / "trace.csv"  # bursty: 2 s at 0.5 /ms, then 1 s at 3 /ms, four times
    rng = np.random.default_rng(0)
    trace.write_text("\n".join(f"{x:.6f}" for x in np.sort(np.concatenate(
        [rng.uniform(k * 3000 + off, k * 3000 + off + span, n) for k in range(4)
         for off, span, n in ((0, 2000, 1000), (2000, 1000, 3000))]))) + "\n")
    # a served-delay file of fixed content for compare --served: what a live calibration finds depends on the host
    from smdp_batch.model.served import ServedDelay

    served = tmp / "fixed_served.json"
    ServedDelay(0.3, 0.02, 0.1, (100.0, 200.0), (np.linspace(1.0, 3.0, 50), np.linspace(1.0, 4.0, 50)),
                carried_per_s=200.0, source={"server": "triton", "model": "stand-in sleeping l(b)"}).save(str(served))
    return {"tmp": tmp, "table": str(table), "bank": str(bank), "profile": _profile(tmp / "p.csv"), "trace": str(trace),
            "served": str(served),
            "old": str(sorted(POLICIES.glob("*.h5"))[0])}


def _commands(f):
    t = f["tmp"]
    small_front = ["--rho", "0.3", "--bmax", "8", "--w2-max", "3", "--points", "4", "--rtol", "0.2", "--extend", "0"]
    return [
        ("solve", ["solve", "--bmax", "8", "-o", str(t / "s.h5")]),
        ("solve", ["solve", "--bmax", "8", "--rho-grid", "0.3,0.6", "-o", str(t / "b2.h5")]),
        ("evaluate", ["evaluate", "--policy", f["table"]]),
        ("evaluate", ["evaluate", "--policy", "static:4", "--bmax", "8"]),
        ("simulate", ["simulate", "--policy", "greedy", "--bmax", "8", "--requests", "2000", "--within-ms", "5,10"]),
        ("compare", ["compare", "--bmax", "8", "--slo-p95-ms", "20", "--requests", "2000"]),
        ("compare", ["compare", "--bmax", "8", "--slo", "p99:25", "--slo", "mean:12", "--rho-range", "0.2:0.5",
                     "--requests", "2000"]),
        ("export", ["export", f["table"], "--to", "triton", "--slo-p99-ms", "30", "--requests", "2000"]),
        ("pareto", ["pareto", *small_front, "--requests", "2000", "--slo-within", "10:90", "-o", str(t / "pick.h5"),
                    "--csv", str(t / "f.csv")]),
        ("pareto", ["pareto", *small_front, "--no-timeouts", "--slo-p95-ms", "20", "--requests", "2000"]),
        ("tables", ["tables", "--bmax", "8", "--rho-grid", "0.3", "--w2-grid", "0,1", "-o", str(t / "tables")]),
        ("solve", ["solve", "--arrivals", "mmpp:0.5,2,0.05,0.05", "--bmax", "8", "-o", str(t / "phase.h5")]),
        ("show", ["show", str(t / "phase.h5")]),
        ("simulate", ["simulate", "--policy", str(t / "phase.h5"), "--requests", "2000", "--phase-rule", "true"]),
        ("show", ["show", f["table"]]),
        ("show", ["show", f["bank"]]),
        ("show", ["show", f["old"]]),
        *[("export", ["export", f["table"], "--to", target, "--requests", "2000", "-o", str(t / f"{target}.txt")])
          for target in ("triton", "tfserving", "ray", "torchserve")],
        ("profile", ["profile", f["profile"]]),
        ("measure", ["measure", "math:fsum", "--sizes", "1,2", "--repeats", "2", "--power-w", "50", "-o", str(t / "m.csv")]),
        ("multibin", ["multibin", "--lam-grid", "2", "--requests", "3000", "--max-waits", "20",
                      "--slo-within-time", "60"]),
        ("fit-arrivals", ["fit-arrivals", f["trace"], "--phases", "auto", "-o", str(t / "fit.json")]),
        ("fit-arrivals", ["fit-arrivals", f["trace"]]),
        ("llm", ["llm", "--lam-grid", "1", "--requests", "40", "--schemes", "static,continuous,perbin-smdp",
                 "--slo-within-s", "5"]),
        *([("calibrate", ["calibrate", "--bmax", "8", "--latency", "affine:0.5,2", "--service", "det", "--server",
                          "triton", "--setting", "triton:max=8,delay_us=3000", "--load-range", "100:200",
                          "--slo-p99-ms", "30", "--requests", "200", "-o", str(t / "served.json")]),
           ("compare", ["compare", "--bmax", "8", "--latency", "affine:0.5,2", "--service", "det", "--slo-p99-ms",
                        "30", "--load-range", "100:200", "--requests", "2000", "--served", f["served"]])]
          if _has("pytriton") else []),
    ]


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def test_every_command_has_a_section():
    from smdp_batch.cli import cli

    sections = _sections(DOC.read_text(encoding="utf-8"))
    assert set(cli.commands) <= set(sections)


def test_every_emitted_key_is_documented(files, capsys):
    seen = set()
    for name, args in _commands(files):
        capsys.readouterr()
        assert main([*args, "--json"]) == 0, (args, capsys.readouterr().err)
        out = json.loads(capsys.readouterr().out)
        missing = undocumented(name, out)
        assert not missing, f"`{' '.join(args)}` emits keys docs/json.md does not list: {missing}"
        seen.add(name)
    from smdp_batch.cli import cli

    # the contract test runs every command (calibrate where PyTriton's server is installed, as in CI)
    assert seen == set(cli.commands) - (set() if _has("pytriton") else {"calibrate"})


def test_readme_points_at_the_contract():
    """The README links the contract, and the docs site lists it in its navigation."""
    readme = (DOC.parent.parent / "README.md").read_text(encoding="utf-8")
    assert "(docs/json.md)" in readme
    nav = (DOC.parent.parent / "mkdocs.yml").read_text(encoding="utf-8")
    assert "json.md" in nav[nav.index("\nnav:"):]
