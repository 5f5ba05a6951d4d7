"""Issue 17 items 5 and 6: what -o may point at, outputs that would overwrite inputs, several outputs
committed together, the file mode, and SIGTERM cleanup (smdp_batch.files).  POSIX only."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from smdp_batch.cli import main

pytestmark = pytest.mark.skipif(os.name != "posix", reason="FIFOs, devices, symlinks and umask are POSIX")

FAST = ["--bmax", "4"]  # a scenario that solves in milliseconds
PROFILE = "batch_size,latency_ms,energy_mj\n1,1.3,20\n2,1.6,40\n3,1.9,58\n4,2.2,75\n1,1.35,21\n2,1.62,41\n3,1.95,59\n4,2.25,76\n"
TRACE = "t\n1\n2\n3\n5\n8\n13\n"


def run(args, capsys):
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out, out.err


def one_error(rc, err, *needles):
    """Exit code 2, exactly one stderr line starting 'smdp-batch: error:', no traceback, naming ``needles``."""
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("smdp-batch: error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert str(n) in lines[0], (n, lines[0])
    return lines[0]


def leftovers(folder):
    """Temporary files (.<name>.*) left in a folder."""
    return sorted(p for p in os.listdir(folder) if p.startswith("."))


def cli(args, cwd, timeout=60, umask=None, **kw):
    """The CLI in a subprocess (``umask``: set before it starts)."""
    pre = (lambda: os.umask(umask)) if umask is not None else None
    return subprocess.run([sys.executable, "-m", "smdp_batch", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, preexec_fn=pre, **kw)


@pytest.fixture
def no_work(monkeypatch):
    """Fail the test if any command reaches its solve/sweep/simulation."""
    import smdp_batch.analysis.pareto as pareto
    import smdp_batch.cli.solve as solve_mod
    import smdp_batch.export.configs as configs
    import smdp_batch.llm.sweep as sweep

    def boom(*a, **k):
        raise AssertionError("work ran before the output was refused")

    for mod, name in ((solve_mod, "solve"), (pareto, "sweep_fronts"), (configs, "export_policy"),
                      (sweep, "multibin_sweep"), (sweep, "llm_sweep")):
        monkeypatch.setattr(mod, name, boom)


@pytest.fixture
def files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prof.csv").write_text(PROFILE)
    (tmp_path / "trace.csv").write_text(TRACE)
    return tmp_path


@pytest.fixture
def table(files, capsys):
    """A small policy table pol.h5 solved from the profile prof.csv."""
    rc, _, err = run(["solve", *FAST, "--latency", "csv:prof.csv", "-o", "pol.h5"], capsys)
    assert rc == 0, err
    return files / "pol.h5"


# ------------------------------------------------------------------------ item 5: what -o points at
def test_fifo_output_is_refused_without_hanging(tmp_path):
    fifo = tmp_path / "pipe.h5"
    os.mkfifo(fifo)
    p = cli(["solve", *FAST, "-o", fifo.name], cwd=tmp_path, timeout=60)
    one_error(p.returncode, p.stderr, "-o pipe.h5", "FIFO")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert leftovers(tmp_path) == []


def test_character_device_output_is_refused(files, capsys, no_work):
    rc, _, err = run(["solve", *FAST, "-o", "/dev/null"], capsys)
    one_error(rc, err, "-o /dev/null", "character device")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    os.symlink("/dev/null", "null.h5")  # a link to a device is refused too, naming the user's path
    rc, _, err = run(["solve", *FAST, "-o", "null.h5"], capsys)
    one_error(rc, err, "-o null.h5", "character device")
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and os.path.islink("null.h5")


def test_directory_output_is_refused(files, capsys, no_work):
    os.mkdir("out.h5")
    rc, _, err = run(["solve", *FAST, "-o", "out.h5"], capsys)
    one_error(rc, err, "-o out.h5", "directory")
    rc, _, err = run(["llm", "--plot", "out.h5/"], capsys)  # no extension: refused as a figure name
    assert rc == 2
    os.mkdir("fig.png")
    rc, _, err = run(["llm", "--plot", "fig.png"], capsys)
    one_error(rc, err, "--plot fig.png", "directory")
    assert os.path.isdir("out.h5") and os.path.isdir("fig.png")


def test_symlink_output_rewrites_its_target(table, capsys):
    from smdp_batch.runtime.schema import read_policy

    os.mkdir("store")
    os.replace("pol.h5", "store/real.h5")
    os.symlink("store/real.h5", "link.h5")
    before = os.stat("store/real.h5").st_ino
    rc, _, err = run(["solve", *FAST, "--w2", "3", "-o", "link.h5"], capsys)
    assert rc == 0, err
    assert os.path.islink("link.h5") and os.readlink("link.h5") == "store/real.h5"
    assert os.stat("store/real.h5").st_ino != before  # replaced atomically, not written in place
    assert read_policy("link.h5").inputs["w2"] == 3
    assert leftovers(".") == [] and leftovers("store") == []


def test_dangling_symlink_is_refused(files, capsys, no_work):
    os.symlink("nowhere/t.h5", "dangling.h5")
    rc, _, err = run(["solve", *FAST, "-o", "dangling.h5"], capsys)
    one_error(rc, err, "-o dangling.h5", "dangling symlink")
    assert os.path.islink("dangling.h5") and not os.path.exists("nowhere")


def test_missing_folder_is_refused(files, capsys, no_work):
    rc, _, err = run(["pareto", *FAST, "--csv", "nodir/p.csv"], capsys)
    one_error(rc, err, "--csv nodir/p.csv", "does not exist")


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root writes into any folder")
def test_read_only_folder_is_refused_before_any_work(files, capsys, no_work):
    os.mkdir("ro")
    os.chmod("ro", 0o500)
    try:
        rc, _, err = run(["pareto", *FAST, "--csv", "ok.csv", "--plot", "ro/p.png"], capsys)
        one_error(rc, err, "--plot ro/p.png", "not writable")
    finally:
        os.chmod("ro", 0o700)
    assert not os.path.exists("ok.csv") and leftovers(".") == []


# ------------------------------------------------------------------------ item 6: output == input
def _same_input_cases():
    # "prof" (no extension) is a profile that an HDF5 output may name: "prof.csv" is refused by its extension first
    return [
        (["solve", *FAST, "--latency", "csv:prof", "-o", "prof"], "prof", "--latency csv:prof"),
        (["solve", *FAST, "--latency", "csv:prof:affine", "-o", "./prof"], "prof", "--latency"),
        (["solve", *FAST, "--energy", "csv:prof", "-o", "prof"], "prof", "--energy csv:prof"),
        (["solve", *FAST, "--service", "empirical:prof", "-o", "prof"], "prof", "--service empirical"),
        (["solve", *FAST, "--service", "mix:0.5*det@1;0.5*empirical:prof@1", "-o", "prof"], "prof",
         "--service mix:"),
        (["solve", *FAST, "--rho-grid", "0.3,0.5", "--latency", "csv:prof", "-o", "prof"], "prof",
         "--latency"),
        (["pareto", *FAST, "--latency", "csv:prof.csv", "--csv", "prof.csv"], "prof.csv", "--csv prof.csv"),
        (["pareto", *FAST, "--latency", "csv:prof", "--slo-mean-ms", "9", "-o", "prof"], "prof", "-o"),
        (["pareto", *FAST, "--latency", "csv:fig.png", "--plot", "fig.png"], "fig.png", "--plot fig.png"),
        (["tables", *FAST, "--w2-grid", "1", "--latency", "csv:prof.csv", "--plot", "./fig.png",
          "--energy", "csv:fig.png"], "fig.png", "--plot"),
        (["tables", *FAST, "--w2-grid", "1", "--latency", "csv:out/README.md", "-o", "out"], "out/README.md",
         "README.md"),
        (["tables", *FAST, "--w2-grid", "1", "--latency", "csv:out/custom_rho0.50_w2-1.h5", "-o", "out"],
         "out/custom_rho0.50_w2-1.h5", "custom_rho0.50_w2-1.h5"),
        (["multibin", "--law", "trace:trace.png", "--plot", "trace.png"], "trace.png", "--law trace:trace.png"),
        (["multibin", "--law", "trace:trace.png:t", "--plot", "trace.png"], "trace.png", "--plot trace.png"),
        (["export", "pol", "--to", "triton", "-o", "pol"], "pol", "policy table"),
    ]


@pytest.mark.parametrize("args,victim,role", _same_input_cases(), ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_output_equal_to_an_input_is_refused_before_any_work(table, capsys, no_work, args, victim, role):
    os.makedirs("out", exist_ok=True)
    (table.parent / "prof").write_text(PROFILE)
    os.link("pol.h5", "pol")
    for name in ("fig.png", "trace.png", "out/README.md", "out/custom_rho0.50_w2-1.h5"):
        (table.parent / name).write_text(PROFILE if not name.startswith("trace") else TRACE)
    before = {p: open(p, "rb").read() for p in ("prof.csv", "pol.h5", victim)}
    listing = sorted(os.listdir(".")), sorted(os.listdir("out"))
    rc, out, err = run(args, capsys)
    one_error(rc, err, role, "input")
    assert out == ""
    for p, data in before.items():
        assert open(p, "rb").read() == data, f"{p} changed"
    assert (sorted(os.listdir(".")), sorted(os.listdir("out"))) == listing  # nothing created, no temp file


def test_hard_link_and_symlink_spellings_of_an_input(files, capsys, no_work):
    os.link("prof.csv", "hard")
    os.symlink("prof.csv", "soft")
    os.symlink("prof.csv", "soft.csv")
    os.symlink("prof.csv", "prof")
    data = open("prof.csv", "rb").read()
    for out in ("hard", "soft", f"../{files.name}/prof", str(files / "prof")):  # names an HDF5 output may take
        rc, _, err = run(["solve", *FAST, "--latency", "csv:prof.csv", "-o", out], capsys)
        one_error(rc, err, f"-o {out}", "--latency csv:prof.csv")
    rc, _, err = run(["solve", *FAST, "--latency", "csv:soft.csv", "-o", "prof"], capsys)
    one_error(rc, err, "-o prof", "--latency csv:soft.csv")
    assert open("prof.csv", "rb").read() == data and os.path.islink("soft")


@pytest.mark.parametrize("args,names", [
    (["pareto", *FAST, "--slo-mean-ms", "9", "-o", "x", "--csv", "./x"], ("-o x", "--csv ./x")),
    (["pareto", *FAST, "--csv", "hard", "--plot", "x.png"], ("--csv hard", "--plot x.png")),
    (["pareto", *FAST, "--slo-mean-ms", "9", "-o", "hard", "--plot", "x.png"], ("-o hard", "--plot x.png")),
])
def test_two_outputs_on_one_path_are_refused(files, capsys, no_work, args, names):
    (files / "x.png").write_text("old")
    (files / "x").write_text("old")
    os.link("x.png", "hard")
    rc, _, err = run(args, capsys)
    one_error(rc, err, *names, "same file")
    assert (files / "x.png").read_text() == "old" and leftovers(".") == []


@pytest.mark.parametrize("make,needle", [
    (lambda: os.symlink("loop.h5", "loop.h5") or "loop.h5", "cannot be followed"),
    (lambda: open("plain", "w").close() or "plain/t.h5", "not a folder"),
    (lambda: "newdir/", "names a folder"),
    (lambda: "", "needs a file name"),
])
def test_odd_output_paths_are_refused(files, capsys, no_work, make, needle):
    path = make()
    rc, _, err = run(["solve", *FAST, "-o", path], capsys)
    one_error(rc, err, needle)
    assert not os.path.exists("newdir")


def test_tables_folder_that_is_a_file_or_holds_a_fifo_is_refused(files, capsys, no_work):
    (files / "notdir").write_text("x")
    rc, _, err = run(["tables", *FAST, "--w2-grid", "1", "-o", "notdir"], capsys)
    one_error(rc, err, "-o notdir", "not a folder")
    os.mkdir("out")
    os.mkfifo("out/custom_rho0.50_w2-1.h5")
    rc, _, err = run(["tables", *FAST, "--w2-grid", "1", "-o", "out"], capsys)
    one_error(rc, err, "custom_rho0.50_w2-1.h5", "FIFO")
    assert os.listdir("out") == ["custom_rho0.50_w2-1.h5"]


# ---------------------------------------------------------------- several outputs: all or none
def _pareto_args():
    return ["pareto", *FAST, "--points", "3", "--no-baselines", "--no-timeouts", "--slo-mean-ms", "9",
            "-o", "p.h5", "--csv", "p.csv", "--plot", "p.png"]


def test_a_late_failure_leaves_no_output_behind(files, capsys, monkeypatch):
    """The figure fails (no space) after the table and the CSV were written: none of the three appears,
    an existing CSV keeps its content, and the error names the user's path, not the temporary file."""
    import matplotlib.figure

    (files / "p.csv").write_text("old csv\n")

    def no_space(self, fname, *a, **k):
        raise OSError(28, "No space left on device", fname)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", no_space)
    rc, out, err = run(_pareto_args(), capsys)
    line = one_error(rc, err, "--plot p.png", "No space left")
    assert ".p.png." not in line
    assert sorted(os.listdir(".")) == ["p.csv", "prof.csv", "trace.csv"]
    assert (files / "p.csv").read_text() == "old csv\n"


def test_all_outputs_appear_together_on_success(files, capsys):
    rc, out, err = run(_pareto_args(), capsys)
    assert rc == 0, err
    assert {"p.h5", "p.csv", "p.png"} <= set(os.listdir(".")) and leftovers(".") == []


def test_an_output_the_command_decides_not_to_write_is_not_touched(files, capsys):
    (files / "p.h5").write_text("old")
    args = ["pareto", *FAST, "--points", "3", "--no-baselines", "--no-timeouts", "--slo-mean-ms", "1.4",
            "-o", "p.h5"]
    rc, out, err = run(args, capsys)
    assert rc == 0, err
    assert "not written p.h5" in out and (files / "p.h5").read_text() == "old" and leftovers(".") == []


def test_tables_failure_removes_the_folder_it_created(files, capsys, monkeypatch):
    import smdp_batch.cli.solve as solve_mod

    def fail(*a, **k):
        raise solve_mod.InputError("injected failure")

    monkeypatch.setattr(solve_mod, "solve", fail)
    rc, _, err = run(["tables", *FAST, "--w2-grid", "1,2", "-o", "new", "--plot", "t.png"], capsys)
    one_error(rc, err, "injected failure")
    assert not os.path.exists("new") and sorted(os.listdir(".")) == ["prof.csv", "trace.csv"]


def test_library_writer_refuses_a_device_and_keeps_a_file_on_failure(table, monkeypatch):
    from smdp_batch.errors import InputError
    from smdp_batch.export.hdf5 import write_policy

    with pytest.raises(InputError, match="character device"):
        write_policy(None, "/dev/null")  # refused before the solution is looked at
    data = table.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 - any failure: the test is about the file that is left
        write_policy(object(), table)  # fails while filling the temporary file
    assert table.read_bytes() == data and leftovers(table.parent) == []


# ------------------------------------------------------------------------------------- file mode
def test_new_files_follow_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    p = cli(["solve", *FAST, "-o", "a.h5"], cwd=tmp_path, umask=0o022)
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "a.h5").st_mode) == 0o644
    p = cli(["solve", *FAST, "-o", "b.h5"], cwd=tmp_path, umask=0o027)
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "b.h5").st_mode) == 0o640
    os.chmod(tmp_path / "a.h5", 0o640)
    p = cli(["solve", *FAST, "--w2", "2", "-o", "a.h5"], cwd=tmp_path, umask=0o022)
    assert p.returncode == 0, p.stderr
    assert stat.S_IMODE(os.stat(tmp_path / "a.h5").st_mode) == 0o640
    assert leftovers(tmp_path) == []


# ------------------------------------------------------------------------------------------ SIGTERM
def _interrupt_a_long_solve(tmp_path, sig):
    """Start a ~20 s bank solve writing -o, send ``sig`` once its temporary file exists; (rc, stderr)."""
    grid = ",".join(f"{0.3 + i * 0.0015:.4f}" for i in range(400))
    # a shell's background job starts with SIGINT ignored, and Python then installs no KeyboardInterrupt
    # handler: restore the default so the signal under test reaches the command wherever the suite runs
    proc = subprocess.Popen([sys.executable, "-m", "smdp_batch", "solve", "--bmax", "64", "--rho-grid", grid,
                             "-o", "bank.h5"], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.default_int_handler))
    try:
        deadline = time.monotonic() + 60
        while not any(n.startswith(".bank.h5.") for n in os.listdir(tmp_path)):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "no temporary file appeared"
            time.sleep(0.05)
        time.sleep(0.3)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, err


def test_sigterm_removes_temporary_files(tmp_path):
    rc, err = _interrupt_a_long_solve(tmp_path, signal.SIGTERM)
    assert rc == 128 + signal.SIGTERM, err
    lines = [x for x in err.splitlines() if not x.startswith("smdp-batch: note: compiling")]
    assert lines == ["smdp-batch: terminated"], err
    assert os.listdir(tmp_path) == []


def test_sigint_removes_temporary_files_too(tmp_path):
    rc, err = _interrupt_a_long_solve(tmp_path, signal.SIGINT)
    assert rc != 0 and "Traceback" not in err, err
    assert os.listdir(tmp_path) == []


def test_sigterm_handler_is_restored(files, capsys):
    before = signal.getsignal(signal.SIGTERM)
    run(["solve", *FAST, "-o", "/dev/null"], capsys)
    assert signal.getsignal(signal.SIGTERM) is before
