"""`perfscope profile --tensor-maps -- COMMAND`: a program's tensor maps, on the CPU.

The capture library (perfscope/native/mapcapture.c) is built with the system's C compiler
and preloaded into a test program (tests/fakes/driver/map_app.c) that runs against a
stand-in driver (fake_libcuda.c, the ABI of cuda.h) and reaches it the three ways programs
do: dlsym on a dlopen handle, the functions cuGetProcAddress hands out, and a direct call
of a linked symbol. The maps the test program encodes are its own (synthetic: a real
program's maps need a GPU); the report the fake ncu writes beside them is a real H200
capture of cuBLAS's decode kernel, so the end-to-end test shows the plumbing from the
library to PS172, not what cuBLAS's own boxes are.
"""

from __future__ import annotations

import json
import lzma
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_ncu import make_fake
from typer.testing import CliRunner

from perfscope import cli, diagnosis, mapcapture, ncu
from perfscope.errors import PerfscopeError
from perfscope.manifest import Capture, RunManifest, Verification, read_manifest
from perfscope.tensormaps import KernelMaps, MapUse, TensorMap, parse_capture, reads_for

runner = CliRunner()
DRIVER = Path(__file__).parent / "fakes" / "driver"
DECODE = Path(__file__).parent / "fixtures" / "external" / "torch_decode_m16.ncu-rep.xz"
BF16, SWIZZLE_128B = 9, 3


def _cc() -> str:
    try:
        return mapcapture.compiler()
    except PerfscopeError:
        pytest.skip("no C compiler (cc, gcc or clang) on this machine")


@pytest.fixture(scope="module")
def native(tmp_path_factory):
    """The capture library, the stand-in driver and the test program, built once."""
    cc = _cc()
    folder = tmp_path_factory.mktemp("native")
    lib = mapcapture.build_library(cc, folder)
    driver = folder / "libcuda.so.1"
    subprocess.run([cc, "-O1", "-shared", "-fPIC", "-o", str(driver), str(DRIVER / "fake_libcuda.c")],
                   check=True)
    app = folder / "map_app"
    subprocess.run([cc, "-O1", "-o", str(app), str(DRIVER / "map_app.c"), f"-I{DRIVER}",
                    f"-L{folder}", "-l:libcuda.so.1", f"-Wl,-rpath,{folder}", "-ldl"], check=True)
    return lib, driver, app


def run_app(native, out: Path, *args: str) -> str:
    lib, driver, app = native
    cmd = mapcapture.wrap_command([str(app), str(driver), *args], lib, out)
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return done.stdout


# ------------------------------------------------------------------ the library


def test_every_path_to_the_driver_is_watched_and_every_call_reaches_it(native, tmp_path):
    out = tmp_path / "maps.jsonl"
    assert run_app(native, out).strip() == "launches 6"     # each launch reached the driver once
    capture = parse_capture(out.read_text().splitlines())
    a = TensorMap(BF16, (8192, 16), (16384,), (64, 16), (1, 1), SWIZZLE_128B)
    b = TensorMap(BF16, (8192, 8192), (16384,), (64, 64), (1, 1), SWIZZLE_128B)
    d = TensorMap(BF16, (4096, 14336), (8192,), (64, 128), (1, 1), SWIZZLE_128B)
    assert capture.kernels == (
        # dlsym's encode (A) and cuGetProcAddress's (B), cuGetProcAddress's legacy launch; A
        # moved by cuTensorMapReplaceAddress is still A, and a forked child's launch (its
        # maps described again under its pid) is the same: three launches together
        KernelMaps("_Z2k1", (128, 1, 1), (128, 1, 1), (MapUse(1, 0, a), MapUse(2, 0, b)), 3),
        # cuLaunchKernelEx on the per-thread stream, B inside a struct at byte 64
        KernelMaps("_Z2k2", (132, 1, 1), (384, 1, 1), (MapUse(1, 64, b),)),
        # parameters in extra's one buffer
        KernelMaps("_Z2k4", (8, 1, 1), (64, 1, 1), (MapUse(0, 128, b),)),
        # the linked symbols: encode and launch
        KernelMaps("_Z2k5", (112, 1, 1), (128, 1, 1), (MapUse(0, 0, d),)),
    )
    # _Z2k3 was passed no map, and map C was encoded and never passed: neither is written.
    text = out.read_text()
    assert "_Z2k3" not in text and '"dims":[4096,4096]' not in text
    assert not capture.truncated and capture.skipped_lines == 0 and capture.unknown_maps == 0
    assert len({json.loads(line)["pid"] for line in text.splitlines()}) == 2


def test_a_python_program_through_ctypes_is_watched(native, tmp_path):
    """ctypes finds driver functions with dlsym on its CDLL handle (the path perfscope's
    own stages take to encode their maps)."""
    lib, driver, _ = native
    out = tmp_path / "maps.jsonl"
    cmd = mapcapture.wrap_command([sys.executable, str(DRIVER / "ctypes_app.py"), str(driver)], lib, out)
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "rc 0 0 launches 1"
    (k,) = parse_capture(out.read_text().splitlines()).kernels
    assert (k.kernel, k.grid, k.maps[0].param) == ("_Z6kernel", (4, 1, 1), 0)
    assert k.maps[0].map == TensorMap(BF16, (8192, 8192), (16384,), (64, 64), (1, 1), SWIZZLE_128B)


def test_without_a_file_named_the_program_runs_unwatched(native, tmp_path):
    lib, driver, app = native
    done = subprocess.run([str(app), str(driver)], capture_output=True, text=True, check=True,
                          env={"LD_PRELOAD": str(lib), "PATH": "/usr/bin:/bin"}, cwd=tmp_path)
    assert done.stdout.strip() == "launches 6" and not list(tmp_path.iterdir())


def test_another_interposers_rtld_next_still_reaches_the_next_library(native, tmp_path):
    """The library interposes dlsym and resolves RTLD_NEXT after itself, so the wrapper
    preloads it last: an interposer the program preloads (a malloc hook, a sanitizer) still
    reaches the library after it, not its own function. Preloaded after the library it
    would not: that order is the wrapper's to avoid (a walk of the objects after the caller
    by dlopen(RTLD_NOLOAD) fixed it, and hung under ncu on the H200)."""
    lib, cc = native[0], _cc()
    c, b, app = tmp_path / "libnextc.so", tmp_path / "libnextb.so", tmp_path / "next_app"
    for argv in ([cc, "-shared", "-fPIC", "-o", str(c), str(DRIVER / "next_c.c")],
                 [cc, "-shared", "-fPIC", "-o", str(b), str(DRIVER / "next_b.c"), "-ldl"],
                 [cc, "-o", str(app), str(DRIVER / "next_app.c"), f"-L{tmp_path}", "-l:libnextc.so",
                  f"-Wl,-rpath,{tmp_path}"]):
        subprocess.run(argv, check=True)
    env = {"PATH": "/usr/bin:/bin"}
    alone = subprocess.run([str(app)], capture_output=True, text=True, check=True,
                           env={**env, "LD_PRELOAD": str(b)})
    assert alone.stdout.strip() == "B>C"
    wrapped = mapcapture.wrap_command([str(app)], lib, tmp_path / "maps.jsonl")
    done = subprocess.run(wrapped, capture_output=True, text=True, check=True,
                          env={**env, "LD_PRELOAD": str(b)})
    assert done.stdout.strip() == "B>C", done.stdout


def test_the_library_is_built_once_per_source_and_compiler(native, tmp_path):
    lib = native[0]
    assert mapcapture.build_library(_cc(), lib.parent) == lib
    assert lib.name.startswith("libmapcapture-") and lib.stat().st_size > 0


def test_a_compiler_that_fails_is_one_sentence(tmp_path):
    bad = tmp_path / "cc"
    bad.write_text("#!/bin/sh\necho 'mapcapture.c:1: error: no such thing' >&2\nexit 1\n")
    bad.chmod(0o755)
    with pytest.raises(PerfscopeError, match=r"did not build with .*error: no such thing"):
        mapcapture.build_library(str(bad), tmp_path / "out")
    assert not list((tmp_path / "out").glob("*"))
    with pytest.raises(PerfscopeError, match="found no C compiler"):
        mapcapture.compiler({"PATH": str(tmp_path / "nowhere")})


def test_the_wrapper_preloads_first_and_execs_the_program(tmp_path):
    argv = mapcapture.wrap_command(["python3", "-c", "print(1)"], Path("/x/lib.so"), Path("/o.jsonl"))
    assert argv[:2] == ["/bin/sh", "-c"] and argv[3:] == ["/x/lib.so", "/o.jsonl", "python3", "-c",
                                                          "print(1)"]
    env = subprocess.run(
        mapcapture.wrap_command(["/bin/sh", "-c", 'echo "$LD_PRELOAD|$PERFSCOPE_TENSOR_MAPS"'],
                                Path("/x/lib.so"), tmp_path / "o.jsonl"),
        capture_output=True, text=True, env={"LD_PRELOAD": "/ncu/inject.so", "PATH": "/usr/bin:/bin"})
    # The dynamic loader warns that /x/lib.so cannot be preloaded; the program still runs.
    assert env.stdout.strip() == f"/ncu/inject.so:/x/lib.so|{tmp_path / 'o.jsonl'}"


# ------------------------------------------------------------------ reading the lines


def test_lines_cut_short_and_launches_naming_unknown_maps_are_skipped_and_counted():
    enc = ('{"pid":1,"encode":1,"dtype":9,"rank":2,"dims":[64,8],"strides":[128],"box":[64,8],'
           '"elem_strides":[1,1],"interleave":0,"swizzle":0,"l2":0,"oob":0}')
    launch = '{"pid":1,"launch":0,"kernel":"k","grid":[1,1,1],"block":[32,1,1],"maps":[[0,0,1]]}'
    got = parse_capture([enc, launch, launch[:30], '{"pid":1,"truncated":9}'])
    assert got.skipped_lines == 1 and got.truncated and got.kernels[0].launches == 1
    other = parse_capture([enc, launch.replace('"pid":1', '"pid":2'), launch])
    assert other.unknown_maps == 1 and other.kernels[0].launches == 1
    assert "1 launch line(s) named a map never described" in mapcapture.note(other)


@pytest.mark.parametrize("tmap, expected", [
    # a 16-bit row-major weight in 64 x 64 boxes: 128-byte runs, rows 16 KB apart
    (TensorMap(BF16, (8192, 8192), (16384,), (64, 64)), (8192, 16384, 64, 128, 128)),
    # a box as wide as a dense row: its 128 rows are one 16 KB run
    (TensorMap(BF16, (64, 4096), (128,), (64, 128)), (4096, 128, 128, 128, 16384)),
    # a weight packed in 64-column strips, (64, K, N / 64): each box 8 KB of one strip
    (TensorMap(BF16, (64, 8192, 128), (128, 1 << 20), (64, 64, 1)), (128, 1 << 20, 1, 8192, 8192)),
])
def test_a_maps_boxes_as_runs(tmap, expected):
    r = tmap.read("w")
    assert (r.rows, r.row_bytes, r.box_rows, r.box_row_bytes, r.run_bytes) == expected
    assert r.layout == "as encoded" and r.bytes == tmap.dims[-1] * tmap.strides[-1]


@pytest.mark.parametrize("tmap", [
    TensorMap(BF16, (4096,), (), (256,)),                              # one dimension: a bulk copy
    TensorMap(BF16, (64, 64), (128,), (64, 64), (2, 1)),               # every other element
    TensorMap(13, (64, 64), (64,), (64, 64)),                          # packed 4-bit elements
    TensorMap(BF16, (64, 64), (128,), (64, 64), (1, 1), 0, 1),         # interleaved
])
def test_boxes_that_are_not_rows_stay_unknown(tmap):
    assert tmap.read("w") is None


def test_a_launch_is_matched_by_name_grid_and_block_and_never_guessed():
    a = TensorMap(BF16, (8192, 8192), (16384,), (64, 64))
    b = TensorMap(BF16, (4096, 4096), (8192,), (64, 64))
    k = (KernelMaps("k", (8, 1, 1), (128, 1, 1), (MapUse(0, 0, a),)),
         KernelMaps("k", (8, 1, 1), (128, 1, 1), (MapUse(0, 0, a),), 3))
    assert reads_for(k, "k", (8, 1, 1), (128, 1, 1))[0].row_bytes == 16384
    assert reads_for(k, "k", (9, 1, 1), (128, 1, 1)) is None          # no such launch shape
    two = (*k, KernelMaps("k", (8, 1, 1), (128, 1, 1), (MapUse(0, 0, b),)))
    assert reads_for(two, "k", (8, 1, 1), (128, 1, 1)) is None        # which one? unknown


def test_the_manifest_keeps_the_maps():
    km = KernelMaps("k", (8, 1, 1), (128, 1, 1),
                    (MapUse(1, 64, TensorMap(BF16, (64, 8), (128,), (64, 8), (1, 1), 3)),), 5)
    m = RunManifest(stage="program", family="program", dtype="", m=0, n=0, k=0, params={},
                    verification=Verification("unverified"),
                    capture=Capture(command=("p",)), tensor_maps=(km,), tensor_maps_note="found")
    assert RunManifest.from_dict(json.loads(json.dumps(m.to_dict()))) == m


# ------------------------------------------------------------------ profile --tensor-maps


@pytest.fixture
def fake_run(tmp_path, monkeypatch):
    """A fake ncu that runs the program it is given, then writes the real decode report."""
    plain = tmp_path / "decode.ncu-rep"
    with lzma.open(DECODE) as src, open(plain, "wb") as dst:
        shutil.copyfileobj(src, dst)
    monkeypatch.setenv("FAKE_NCU_REPORT", str(plain))
    monkeypatch.setenv("FAKE_NCU_RUN", "1")
    monkeypatch.setenv("PERFSCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(ncu, "STOP_SELF_S", 0.1)
    exe, _ = make_fake(tmp_path, "ok")
    monkeypatch.setenv("PERFSCOPE_NCU", exe)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    return work


NVJET = "nvjet_sm90_tst_64x16_64x16_2x1_v_bz_NNT"     # the decode report's kernel, grid (2, 64, 1)


def profile_app(native, grid_y: str):
    """`perfscope profile --tensor-maps` over the test program, which launches the decode
    report's kernel by name on a (2, grid_y) grid of 384 threads with its own (synthetic)
    maps: A 16 x 8192 and B 8192 x 8192 in 64 x 64 boxes, as a decode GEMM would take them."""
    _, driver, app = native
    return runner.invoke(cli.app, ["profile", "--tensor-maps", "--shape", "16x8192x8192",
                                   "--dtype", "bf16", "--out", "cap.ncu-rep", "--program",
                                   json.dumps([str(app), str(driver), NVJET, "2", grid_y, "384"])])


def test_profile_records_the_maps_beside_the_report(native, fake_run):
    result = profile_app(native, "64")
    assert result.exit_code == 0, result.output
    assert "tensor maps: 6 launch(es) of 4 kernel(s) were passed tensor maps" in result.output
    manifest = read_manifest(fake_run / "cap.json")
    assert manifest.capture.command[1] == str(native[1])     # the user's command, not the wrapper
    assert manifest.tensor_maps_note.startswith("6 launch(es)")
    assert {k.kernel for k in manifest.tensor_maps} == {NVJET, "_Z2k2", "_Z2k4", "_Z2k5"}
    assert not list(fake_run.glob(".*"))                     # the raw lines are not left behind
    # The matching launch is read through the maps: PS172 judges a kernel we did not write.
    (record,) = diagnosis.diagnose([fake_run / "cap.ncu-rep"])
    assert [r.operand for r in record.reads] == ["parameter 1 (bf16 16 x 8192)",
                                                 "parameter 2 (bf16 8192 x 8192)"]
    hit = next(f for f in record.evaluation.findings if f.code == "PS172")
    assert 0 < hit.estimated_gain <= 0.05
    assert any("parameter 2 (bf16 8192 x 8192)" in e.metric for e in hit.evidence)


def test_a_launch_of_another_shape_is_not_matched(native, fake_run):
    result = profile_app(native, "1")                        # (2, 1, 1): not the report's launch
    assert result.exit_code == 0, result.output
    (record,) = diagnosis.diagnose([fake_run / "cap.ncu-rep"])
    assert record.reads is None
    (ps172,) = [n for n in record.evaluation.not_evaluated if n.code == "PS172"]
    assert "--tensor-maps" in ps172.reason


def test_no_compiler_is_one_sentence_and_writes_nothing(fake_run, monkeypatch, tmp_path):
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    result = runner.invoke(cli.app, ["profile", "--tensor-maps", "--out", "cap.ncu-rep",
                                     "--program", json.dumps(["true"])])
    assert result.exit_code == 2, result.output
    text = result.output.strip()
    assert len(text.splitlines()) == 1 and "could not run the C compiler" in text
    assert not list(fake_run.iterdir())


@pytest.mark.parametrize("stage", ["hgemm_small_m", "hgemm_small_m_packed", "hgemm_tma_wgmma_persistent"])
def test_our_own_maps_read_as_the_planner_reads_them(stage):
    """A map perfscope encodes for its own stage, read back as a program's would be, gives
    the reads kernels/maps.py plans (the GPU test runs the stage as a program to show the
    capture records these very maps)."""
    from perfscope.kernels import get_spec, parse_shape
    from perfscope.kernels.maps import plan_maps
    from perfscope.kernels.registry import declared_params, run_reads

    shape = parse_shape("16x8192x8192")
    params = declared_params(stage, shape)
    planned = run_reads(stage, params, "bf16", shape)
    plans = plan_maps(get_spec(stage).with_params(**params), "bf16", shape)[:2]
    read = [TensorMap(p.data_type, p.dims, (p.row_stride,), p.box, (1, 1), p.swizzle).read(p.operand)
            for p in plans]
    assert [(r.rows, r.row_bytes, r.box_rows, r.box_row_bytes, r.run_bytes) for r in read] == \
        [(r.rows, r.row_bytes, r.box_rows, r.box_row_bytes, r.run_bytes) for r in planned]


# ------------------------------------------------------------------ a stage's run: cuBLAS's maps


def test_a_stage_run_records_cublas_maps_into_its_manifest(tmp_path, monkeypatch):
    """`perfscope profile cublas_bgemm --tensor-maps`: the runner runs under the wrapper (the
    fake ncu, which cannot run it, writes lines standing for the library's: cuBLAS's kernel
    of the real report, by name and launch shape, passed a synthetic map), and the stage's
    manifest keeps the maps of the kernels its report holds; diagnose reads them."""
    _cc()
    from perfscope import profiling
    from perfscope.profile import load

    one = tmp_path / "one.ncu-rep"
    with lzma.open(Path(__file__).parent / "fixtures" / "h200" / "cublas_bgemm_4096.ncu-rep.xz") as src, \
            open(one, "wb") as dst:
        shutil.copyfileobj(src, dst)
    (kp,) = load(one)
    i = kp.identity
    lines = tmp_path / "lines.jsonl"
    lines.write_text("\n".join([
        json.dumps({"pid": 7, "encode": 1, "dtype": BF16, "rank": 2, "dims": [4096, 4096],
                    "strides": [8192], "box": [64, 128], "elem_strides": [1, 1], "swizzle": 3}),
        json.dumps({"pid": 7, "launch": 0, "kernel": i.mangled, "grid": list(i.grid),
                    "block": list(i.block), "maps": [[0, 64, 1]]}),
        json.dumps({"pid": 7, "launch": 1, "kernel": "_Z5other", "grid": [1, 1, 1],
                    "block": [32, 1, 1], "maps": [[0, 0, 1]]}),
    ]) + "\n")
    monkeypatch.setenv("FAKE_NCU_STAGE_REPORT", str(one))
    monkeypatch.setenv("FAKE_NCU_REPORT", str(one))
    monkeypatch.setenv("FAKE_NCU_MAPS", str(lines))
    monkeypatch.setenv("PERFSCOPE_CACHE", str(tmp_path / "cache"))
    exe, log = make_fake(tmp_path, "ok")
    monkeypatch.setenv("PERFSCOPE_NCU", exe)
    req = profiling.ProfileRequest(stages=("cublas_bgemm",), dtypes=("bf16",), out=tmp_path / "out",
                                   tensor_maps=True)
    (result,) = profiling.profile_stages(req).results
    assert result.verdict == "ok", result
    (argv,) = [c for c in map(json.loads, log.read_text().splitlines())
               if "--export" in c and "--import" not in c]
    assert argv[argv.index("--export") + 2:][:2] == ["/bin/sh", "-c"] and "perfscope.runner" in argv
    # The fake runner's manifest holds only a verdict: the maps were written into it.
    doc = json.loads(result.manifest.read_text())
    kernels = tuple(KernelMaps.from_dict(k) for k in doc["tensor_maps"])
    assert [k.kernel for k in kernels] == [i.mangled]                    # not _Z5other's
    assert doc["tensor_maps_note"].startswith("2 launch(es) of 2 kernel(s)")
    # As the real runner's manifest would read, with those maps: diagnose reads cuBLAS's boxes.
    full = RunManifest(stage="cublas_bgemm", family="cublas", dtype="bf16", m=4096, n=4096, k=4096,
                       params={}, verification=Verification("ok"), tensor_maps=kernels,
                       tensor_maps_note=doc["tensor_maps_note"])
    result.manifest.write_text(json.dumps(full.to_dict()))
    (record,) = diagnosis.diagnose([result.report])
    assert [r.operand for r in record.reads] == ["parameter 0 at byte 64 (bf16 4096 x 4096)"]


def test_diff_against_cublas_records_the_references_maps_when_a_has_them(native, fake_run, monkeypatch):
    """A program captured with --tensor-maps, held against `cublas` that is not there yet:
    the reference profiled on demand is recorded the same way (its run goes through the
    wrapper), so the diff can set cuBLAS's boxes beside A's."""
    from perfscope import profiling

    assert profile_app(native, "64").exit_code == 0
    monkeypatch.setattr(profiling, "driver_device_count", lambda: 1)
    monkeypatch.setattr(profiling, "_gpu_name", lambda: "NVIDIA H200")
    monkeypatch.setenv("FAKE_NCU_STAGE_REPORT", str(fake_run.parent / "decode.ncu-rep"))
    log = fake_run.parent / "ncu-argv.log"                   # make_fake's, beside the work folder
    result = runner.invoke(cli.app, ["diff", "cap.ncu-rep", "cublas"])
    assert result.exit_code == 0, result.output
    (made,) = [c for c in map(json.loads, log.read_text().splitlines())
               if "perfscope.runner" in c and "--import" not in c]
    assert made[made.index("--export") + 2:][:2] == ["/bin/sh", "-c"]


def test_a_report_that_cannot_be_read_keeps_the_manifest_and_says_why(tmp_path):
    """The maps cannot be matched to a broken report's launches: the manifest keeps what the
    runner wrote, and its note says why there are no maps."""
    from perfscope import profiling
    from perfscope.documents import StageResult

    broken = tmp_path / "s.ncu-rep"
    broken.write_bytes(b"not a report")
    manifest = tmp_path / "s.json"
    manifest.write_text(json.dumps({"verification": {"verdict": "ok"}}))
    profiling._attach_maps([StageResult("s", "ok", broken, manifest)], (), "found")
    doc = json.loads(manifest.read_text())
    assert doc["verification"] == {"verdict": "ok"} and "tensor_maps" not in doc
    assert doc["tensor_maps_note"].startswith("the report could not be read to match the maps")
