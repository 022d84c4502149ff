"""pytest integration: one test per captured tensor, ids = canonical names.

    pytest parity/                        # bf16 target against golden/tiny-bitnet
    pytest parity/ -k layer3.             # only layer 3's tensors (`-k layer3`: also layer30.. of a deep model)
    pytest parity/ --target vllm --tol attention=2e-2

The target runs once per session; each test reports its own tensor, and the terminal
summary names the first divergent layer and operator.  A stale golden set fails every test
with the reason (what changed), never with numbers.
"""
from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from .dump import DEFAULT_GOLDEN, DEFAULT_MODEL, ROOT

_STATE: dict = {}


def pytest_addoption(parser):
    g = parser.getgroup("parity", "layer-by-layer numerical parity")
    g.addoption("--target", default="bf16", help="target under test (reference, bf16, transformers, vllm, ...)")
    g.addoption("--target-opt", action="append", default=[], metavar="KEY=VALUE",
                help="option for the target's constructor (repeatable), e.g. --target-opt dtype=bfloat16")
    g.addoption("--model", default=str(DEFAULT_MODEL), help="model directory")
    g.addoption("--golden", default=None, help="golden set directory (default golden/<model dir name>)")
    g.addoption("--spec", default=None, help="format spec JSON (default: from the model dir)")
    g.addoption("--tol", action="append", default=[], metavar="TIER[.atol|.rtol]=X",
                help="override a tolerance tier, e.g. --tol attention=2e-2")
    g.addoption("--jump-gate", action="store_true", help="fail tensors flagged as error jumps")
    g.addoption("--runs", default=str(ROOT / "parity_runs"), help="where run reports and snapshots go")


def pytest_configure(config):
    config.addinivalue_line("markers", "parity: a per-tensor parity test (collected from the golden manifest)")


def _paths(config):
    model = Path(config.getoption("--model"))
    golden = Path(config.getoption("--golden") or ROOT / "golden" / model.resolve().name)
    spec = config.getoption("--spec")
    return model, golden, (Path(spec) if spec else None)


def golden_problem(config):
    """Why the golden set cannot give the test names (None: it can): missing, or a manifest that is not a golden
    manifest. Said by test_parity's placeholder test and, since `-k` may deselect that, by the terminal summary."""
    model, golden, _ = _paths(config)
    mf = golden / "manifest.json"
    if not mf.exists():
        return (f"no golden set at {golden} (no manifest.json): make one with `python -m parity.dump --ref --model "
                f"{shlex.quote(str(model))} --out {shlex.quote(str(golden))}`")
    try:
        order = json.loads(mf.read_text())["order"]
        if not isinstance(order, list):
            raise TypeError(f"'order' is {type(order).__name__}")
        bad = [n for n in order if not isinstance(n, str)]
        if bad:
            raise TypeError(f"'order' holds {len(bad)} non-string entries, e.g. {bad[0]!r}")
    except (ValueError, KeyError, TypeError, OSError) as e:
        from .golden import regen_command

        return f"{mf}: not a golden manifest ({type(e).__name__}: {e}); regenerate with {regen_command(golden, model=model)}"
    return None


def parity_names(config) -> list[str]:
    _, golden, _ = _paths(config)
    if golden_problem(config) is not None:
        return ["golden-missing"]
    return list(json.loads((golden / "manifest.json").read_text())["order"]) + ["top10"]


def pytest_generate_tests(metafunc):
    if "parity_name" in metafunc.fixturenames:
        _STATE["parity_collected"] = True
        names = parity_names(metafunc.config)
        metafunc.parametrize("parity_name", names, ids=names)


def pytest_deselected(items):
    _STATE["parity_deselected"] = _STATE.get("parity_deselected", 0) + sum(
        1 for it in items if it.get_closest_marker("parity") is not None)


def pytest_collection_finish(session):
    _STATE["selected"] = len(session.items)


def selection_problem(config) -> str | None:
    """Why `-k` ran no parity test although the golden set has some (None: it ran some, or none were deselected):
    the expression, how many tensors it left out and which layers the set has, e.g. `-k layer7` on a 2-layer model."""
    expr = config.getoption("keyword", "") or ""
    # only when nothing at all ran and -k is why (not -m / --deselect, nor a -k that picked other tests)
    if not expr or _STATE.get("selected", 1) > 0 or not _STATE.get("parity_deselected") or golden_problem(config):
        return None
    import re

    model, golden, _ = _paths(config)
    names = parity_names(config)
    layers = sorted({int(m.group(1)) for n in names for m in [re.match(r"layer(\d+)\.", n)] if m})
    have = f"layers {layers[0]}-{layers[-1]}" if layers else "no layer tensors"
    listing = "pytest parity/ --collect-only -q"
    for opt, val in (("--model", model), ("--golden", golden)):
        if config.getoption(opt) not in (None, str(DEFAULT_MODEL)):
            listing += f" {opt} {shlex.quote(str(val))}"
    return (f"-k {expr!r} selected none of the {len(names)} parity tests of {golden} ({have}; names like "
            f"{names[1] if len(names) > 1 else names[0]!r}); `{listing}` lists them")


@pytest.fixture(scope="session")
def parity_result(request):
    from .run import run_parity
    from .tolerances import parse_overrides

    cfg = request.config
    if "result" not in _STATE:
        model, golden, spec = _paths(cfg)
        try:
            from .targets import parse_options
            _STATE["result"] = run_parity(cfg.getoption("--target"),
                                          target_options=parse_options(cfg.getoption("target_opt")),
                                          model_dir=model, golden_dir=golden,
                                          spec_path=spec, tol_overrides=parse_overrides(cfg.getoption("--tol")),
                                          runs_dir=Path(cfg.getoption("--runs")))
        except Exception as e:  # stale golden, bad checkpoint, target failure: say it once per test
            _STATE["result"] = e
    res = _STATE["result"]
    if isinstance(res, Exception):
        pytest.fail(f"{type(res).__name__}: {res}", pytrace=False)
    return res


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    res = _STATE.get("result")
    if res is None:
        why = (golden_problem(config) or selection_problem(config)) if _STATE.get("parity_collected") else None
        if why:  # the placeholder test was deselected (-k) or not run, or -k matched no tensor: say it anyway
            terminalreporter.write_sep("=", "parity", red=True)
            terminalreporter.write_line(why)
        return
    tr = terminalreporter
    if isinstance(res, Exception):
        tr.write_sep("=", "parity", red=True)
        tr.write_line(f"{type(res).__name__}: {res}")
        return
    cmp = res.comparison
    tr.write_sep("=", "parity", red=not cmp.passed, green=cmp.passed)
    if not cmp.passed:
        from .report import format_table, table

        df = table(cmp)
        fd = cmp.first_divergence
        if fd is not None:
            lo = max(0, fd.order - 3)
            tr.write_line(format_table(df.iloc[lo:fd.order + 8]))
    tr.write_line(cmp.summary())
    if res.run_dir:
        tr.write_line(f"report and snapshots: {res.run_dir}")
